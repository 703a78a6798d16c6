"""The oracle's activation-quantization switch (off by default).

`quantize_fp8_linear_inputs(model)` makes every linear that the released checkpoint stores as
FP8 blocks (`release_manifest.release_kind(name) == FP8`: attn.wq_a, wkv, wq_b, wo_a, wo_b,
indexer.wq_b, the shared experts' w1/w2/w3, engram.wkv) fake-quantize its input the way
SGLang's FP8 linears do (`layers.act_quant`), except two:
    attn.wo_a    SGLang dequantizes it to BF16 at load for 32x32-block checkpoints and runs it
                 on unquantized activations;
    engram.wkv   its input is the concatenated FP8 table rows (e4m3 values times one UE8M0
                 scale per 32), already on the grid the quantizer maps to, so quantizing it is
                 the identity (and `Engram.forward` reads the weight, not the module).
The routed experts (FP4 weights) keep unquantized activations. Returns the hook handles;
`.remove()` on each turns the switch off again.

A GPU node's served outputs are compared with the oracle under this switch
(`scripts/gpu_node_check.sh`).
"""

from torch import nn

from sglang_dsv41.layers.act_quant import fake_quant_act_fp8
from sglang_dsv41.weights.release_manifest import FP8, release_kind

UNQUANTIZED_INPUTS = (".attn.wo_a", ".engram.wkv")


def _hook(module, args):
    return (fake_quant_act_fp8(args[0]),) + tuple(args[1:])


def fp8_linear_names(model: nn.Module) -> list:
    """Module names of `model` whose inputs SGLang quantizes (see the module docstring)."""
    return [
        name
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear)
        and release_kind(name + ".weight") == FP8
        and not name.endswith(UNQUANTIZED_INPUTS)
    ]


def quantize_fp8_linear_inputs(model: nn.Module) -> list:
    """Install the switch on `model` (the oracle or the served torch model); returns handles."""
    mods = dict(model.named_modules())
    return [mods[n].register_forward_pre_hook(_hook) for n in fp8_linear_names(model)]
