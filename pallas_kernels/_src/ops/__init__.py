"""One folder per op: reference, config, kernel, vjp, guard, api, arg_specs."""
