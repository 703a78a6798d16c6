"""sglang-dsv41: DeepSeek-V4.1 (CSA2) for SGLang. The core imports torch only, never sglang."""
