"""The served layer loop on the kernel path whatever the device (tests force it on CPU, where the
kernel dispatchers run their torch references)."""

import functools

from sglang_dsv41.serving.kernel_path import attention_layer
from sglang_dsv41.sglang.layer_loop import run_layers as _run_layers

run_layers = functools.partial(_run_layers, attention=attention_layer)
