"""Fast ops, one per folder: `ref.py` (torch reference, calling the formulas in
`sglang_dsv41/layers/`), `triton.py` (SM90+), `sm100.py` where a Blackwell library path exists
(DeepGEMM, FlashMLA), and `__init__.py` dispatching by a cached capability check
(`dispatch.py`). Arguments are named bundles (`args.py`). Installed as `sglang_dsv41.kernels`.
`DSV41_FORCE_REF=1` forces the references, `DSV41_FORCE_FAST=1` / `DSV41_KERNEL_PATH` make a
fallback raise; what runs where: docs/kernels.md."""
