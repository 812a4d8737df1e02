"""A server's published configuration, made by SGLang itself: `ServerArgs` resolved for a tiny DSV4 model
and published as a scheduler process publishes it (`runtime_context.publish`).

SGLang's code reads its configuration from process-wide namespaces (`get_memory()`, `get_parallel()`,
`get_exec()`, ...) that a server publishes at start from its resolved arguments. Which leaves a release
reads changes from release to release (0.5.21's eager registry reads `get_parallel().dp_size`, 0.5.23's
does not), so the harness publishes them the way a server does, from a model directory it writes: a
DeepSeek-V4 `config.json` with few heads and layers and DSV4's head dimension (512), window (128), top-k
(512) and compress ratios. Nothing is downloaded; the tokenizer is skipped. The case's switches are then set
for each step through SGLang's own override objects (`platform.sglang_config`).

The configuration is published once per process: `publish` is last-publish-wins in SGLang, and every case
of a campaign runs on the same server.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

# A DeepSeek-V4 of three layers (one of each compress ratio) and two heads: SGLang's ServerArgs resolution reads
# the architecture, the attention shape and the compress ratios; the sizes of the MoE and projections only
# need to be consistent.
DSV4_ARCHITECTURES = ["DeepseekV4ForCausalLM"]  # the served model's, as its config.json names it
TINY_DSV4 = {
    "architectures": DSV4_ARCHITECTURES, "model_type": "deepseek_v4", "torch_dtype": "bfloat16",
    "num_hidden_layers": 3, "compress_ratios": [0, 4, 128], "num_attention_heads": 2, "num_key_value_heads": 1,
    "hidden_size": 256, "head_dim": 512, "v_head_dim": 512, "qk_nope_head_dim": 448, "qk_rope_head_dim": 64,
    "window_size": 128, "sliding_window": 128, "index_topk": 512, "index_n_heads": 2, "index_head_dim": 128,
    "q_lora_rank": 64, "o_lora_rank": 64, "o_groups": 1, "intermediate_size": 64, "moe_intermediate_size": 64,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "vocab_size": 1024,
    "max_position_embeddings": 65536,
}


def _model_dir() -> Path:
    """A directory holding the tiny model's config.json, removed when the process exits."""
    path = Path(tempfile.mkdtemp(prefix="harness-dsv4-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    (path / "config.json").write_text(json.dumps(TINY_DSV4))
    return path


_published: list = []  # the ServerArgs the process's server was published from


def publish(api, device: str) -> None:
    """Resolve and publish the tiny server's configuration, once per process. `device`: SGLang's device
    argument, "cpu" on the simulator or "cuda"."""
    if _published:
        return
    server_args = api.mods["server_args"].ServerArgs(model_path=str(_model_dir()), device=device,
                                                     skip_tokenizer_init=True)
    api.mods["runtime"].publish(server_args, role="scheduler")
    _published.append(server_args)


def server_args():
    """The published server's resolved `ServerArgs` (a model runner's `server_args`)."""
    if not _published:
        raise RuntimeError("the tiny server's configuration was read before it was published")
    return _published[0]
