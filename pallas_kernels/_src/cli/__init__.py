"""`python -m pallas_kernels`: one module per verb, `main.py` dispatches."""
