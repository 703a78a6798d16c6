"""Fast ops, one per folder: `ref.py` (torch reference), `triton.py` (SM90+), `sm100.py` where a
Blackwell library path exists, and `__init__.py` dispatching by a cached capability check.
Installed as `sglang_dsv41.kernels`. `DSV41_FORCE_REF=1` forces the references."""
