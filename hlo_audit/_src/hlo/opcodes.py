"""HLO opcodes: the one table of their names and the categories analyses use.

Opcodes stay plain strings in the IR (XLA adds new ones often); this module
classifies them so no analysis keeps its own list.
"""

from __future__ import annotations

#: Every opcode XLA's text format names, as printed.
OPCODES = frozenset("""
abs acos acosh add add-dependency after-all all-gather all-gather-done
all-gather-start all-reduce all-reduce-done all-reduce-start all-to-all and
asin asinh async-done async-start async-update atan2 atanh batch-norm-grad
batch-norm-inference batch-norm-training bitcast bitcast-convert broadcast call
cbrt ceil cholesky clamp count-leading-zeros collective-broadcast
collective-permute collective-permute-done collective-permute-start compare
complex concatenate conditional constant convert convolution copy copy-done
copy-start cosine cosh custom-call divide domain dot dynamic-reshape
dynamic-slice dynamic-update-slice erf exponential exponential-minus-one fft
floor fusion gather get-dimension-size get-tuple-element imag infeed iota
is-finite log log-plus-one logistic map maximum minimum mulhi multiply negate
not opt-barrier or outfeed pad parameter partition-id popcnt power
ragged-all-to-all ragged-dot real recv recv-done reduce reduce-precision
reduce-scatter reduce-window remainder replica-id reshape reverse rng
rng-bit-generator rng-get-and-update-state round-nearest-afz
round-nearest-even rsqrt scaled-dot scan scatter select select-and-scatter send
send-done set-dimension-size shift-left shift-right-arithmetic
shift-right-logical sign sine sinh slice sort sqrt stochastic-convert subtract
tan tanh topk transpose triangular-solve tuple while xor
""".split())

#: Opcodes whose result shape XLA can infer when the text omits it.
CAN_INFER_SHAPE = frozenset("""
abs acos acosh asin asinh add add-dependency after-all atan2 atanh
batch-norm-grad batch-norm-inference batch-norm-training broadcast call ceil
cholesky clamp count-leading-zeros compare complex concatenate conditional
convolution copy cosine cosh opt-barrier divide domain dot erf exponential
exponential-minus-one fft floor gather get-dimension-size set-dimension-size
get-tuple-element imag is-finite log log-plus-one logistic and not or xor map
maximum minimum multiply negate pad partition-id popcnt power ragged-dot real
reduce remainder replica-id reverse round-nearest-afz round-nearest-even rsqrt
scan scaled-dot scatter select shift-left shift-right-arithmetic
shift-right-logical sign sine sinh sqrt cbrt reduce-window select-and-scatter
sort subtract tan tanh transpose triangular-solve tuple while topk
""".split())

#: Elementwise opcodes with one operand.
UNARY_ELEMENTWISE = frozenset("""
abs acos acosh asin asinh atanh cbrt ceil cosine cosh count-leading-zeros erf
exponential exponential-minus-one floor imag is-finite log log-plus-one
logistic negate not popcnt real round-nearest-afz round-nearest-even rsqrt
sign sine sinh sqrt tan tanh convert bitcast-convert reduce-precision copy
""".split())

#: Elementwise opcodes with two or three operands.
NARY_ELEMENTWISE = frozenset("""
add atan2 and clamp compare complex divide maximum minimum mulhi multiply or
power remainder select shift-left shift-right-arithmetic shift-right-logical
stochastic-convert subtract xor
""".split())

ELEMENTWISE = UNARY_ELEMENTWISE | NARY_ELEMENTWISE

#: Ops that move or reinterpret data without arithmetic.
DATA_MOVEMENT = frozenset("""
bitcast broadcast concatenate copy dynamic-slice dynamic-update-slice gather
iota pad reshape reverse scatter slice transpose
""".split())

#: Collective communication, including async start/done halves.
COLLECTIVES = frozenset("""
all-gather all-gather-start all-gather-done all-reduce all-reduce-start
all-reduce-done all-to-all ragged-all-to-all collective-broadcast
collective-permute collective-permute-start collective-permute-done
reduce-scatter send send-done recv recv-done
""".split())

#: Matrix-multiply-like anchors.
MATMUL_LIKE = frozenset({"dot", "convolution", "ragged-dot", "scaled-dot"})

#: Ops that compute nothing themselves: aliases of an operand's buffer or
#: bookkeeping.
NO_COMPUTE = frozenset({"parameter", "constant", "get-tuple-element", "tuple",
                        "bitcast", "after-all", "add-dependency", "opt-barrier",
                        "domain", "partition-id", "replica-id"})

_ASYNC_SUFFIXES = ("-start", "-update", "-done")
_ASYNC_OPCODE = {"-start": "async-start", "-update": "async-update",
                 "-done": "async-done"}


def resolve(word: str) -> tuple[str, str | None] | None:
  """Splits an opcode word into (opcode, async wrapped opcode).

  "add" -> ("add", None); "custom-call-start" -> ("async-start",
  "custom-call"); "all-reduce-start" stays ("all-reduce-start", None) since it
  is an opcode of its own. Returns None for an unknown word.
  """
  if word in OPCODES:
    return word, None
  for suffix in _ASYNC_SUFFIXES:
    if word.endswith(suffix):
      wrapped = word[: -len(suffix)]
      if wrapped in OPCODES:
        return _ASYNC_OPCODE[suffix], wrapped
  return None


#: Operand counts XLA's parser insists on, for opcodes with a fixed arity.
ARITY: dict[str, int] = {
    **{op: 1 for op in """
        abs acos acosh asin asinh atanh cbrt ceil cosine cosh count-leading-zeros
        erf exponential exponential-minus-one floor imag is-finite log
        log-plus-one logistic negate not popcnt real round-nearest-afz
        round-nearest-even rsqrt sign sine sinh sqrt tan tanh convert
        bitcast-convert bitcast copy copy-start copy-done opt-barrier
        all-gather-done all-reduce-done collective-permute-done
        get-tuple-element reshape reverse slice transpose broadcast fft
        cholesky reduce-precision topk while recv recv-done send-done infeed
        get-dimension-size async-update async-done""".split()},
    **{op: 2 for op in """
        add divide multiply subtract atan2 complex maximum minimum power
        remainder and or xor shift-left shift-right-arithmetic
        shift-right-logical stochastic-convert compare convolution pad
        triangular-solve add-dependency send outfeed set-dimension-size""".split()},
    **{op: 3 for op in "clamp select select-and-scatter batch-norm-training".split()},
    **{op: 5 for op in "batch-norm-inference batch-norm-grad".split()},
    **{op: 0 for op in "iota replica-id partition-id rng-get-and-update-state".split()},
}
