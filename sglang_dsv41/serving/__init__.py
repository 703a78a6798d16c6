"""The one cached path of the served model (pure torch; no sglang).

context       the batch rows and per-forward state (Rows, BatchContext, ForwardShared, PartShared)
geometry      the one byte calculator of the pool (full slots, SWA slots, request slots)
buffers       RecordBuffers: the pool's tensors (SGLang's pool derives from it)
stores        what a layer writes: SWA records, main-KV and index-K entries
attention     the cached attention sublayer (indexer, candidate pool, sparse attention)
layer_loop    the served layer loop (bounded replay, Engram)
engram_history  n-gram windows of a batch from the request slots' tails
toy           a toy scheduler for tests without SGLang
"""
