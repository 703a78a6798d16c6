"""SGLang glue: the only package that imports sglang (plugin, HF config, model, backend, pool)."""
