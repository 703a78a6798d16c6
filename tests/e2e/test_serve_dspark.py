"""`--speculative-algorithm DSPARK` on a CPU, with the tiny checkpoint (which carries a DSpark
head): SGLang 0.5.23 refuses the device at argument resolution, before any model loads
(docs/speculative.md 4), and says so. The exactness check a CPU run would give (greedy with
speculation equals greedy without) runs under the toy scheduler instead
(tests/cpu/test_dspark_verify.py). When this test fails because the server started, SGLang's
worker accepts a CPU: replace it with that end-to-end check.
"""

from __future__ import annotations

import pytest
from e2e.conftest import start_server

REFUSAL = "DSpark speculative decoding only supports CUDA, NPU or XPU device."


def test_dspark_is_refused_on_cpu_naming_the_device(tmp_path_factory, tiny_dir):
    with pytest.raises(RuntimeError, match="server exited") as err:
        server = start_server(
            tmp_path_factory, tiny_dir, "dspark", "--speculative-algorithm", "DSPARK"
        )
        server.stop()
    assert REFUSAL in str(err.value)
