"""LoRA adapters for tests: a random PEFT adapter made on the spot, and a real S3-compatible store.

``make_adapter(folder, model_dir)``: ``adapter_config.json`` + ``adapter_model.safetensors`` for
the model whose ``config.json`` is in ``model_dir``, written with torch and safetensors (no peft):
the PEFT layout vLLM loads (``vllm/lora/lora_model.py from_local_checkpoint``: tensor names
``base_model.model.<module>.lora_A.weight`` [r, in] and ``lora_B.weight`` [out, r]; the config's
``r``, ``lora_alpha``, ``target_modules`` read by ``vllm/lora/peft_helper.py``). Random B (PEFT
initialises it to zeros, which would make the adapter a no-op), and A and B ten times the tiny
model's own weights' scale (``initializer_range`` 0.02), so the adapter visibly moves the logits.

``S3Store``: moto's S3 server, a real process (``python -m moto.server``) bound to 127.0.0.1 on
a free port (or, with ``prefix`` = a test host's ``ns_exec``, inside that host's namespaces, bound to
its address), with a boto3 client to upload; ``env`` is what the nodes need to reach it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.wait import wait_until

# The credentials moto accepts (any); the region pyarrow's S3 client signs for.
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def make_adapter(folder: Path, model_dir: Path, *, rank: int = 8, targets: tuple[str, ...] = ("q_proj", "v_proj"), seed: int = 0,
                 scale: float = 0.2) -> Path:
    import torch
    from safetensors.torch import save_file

    config = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    outs = {"q_proj": heads * head_dim, "k_proj": config["num_key_value_heads"] * head_dim,
            "v_proj": config["num_key_value_heads"] * head_dim, "o_proj": hidden}  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module in targets:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            fan_in = heads * head_dim if module == "o_proj" else hidden
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator, dtype=torch.float32) * scale
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(outs[module], rank, generator=generator, dtype=torch.float32) * scale
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(folder / "adapter_model.safetensors"))
    adapter_config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
                      "target_modules": list(targets), "bias": "none", "base_model_name_or_path": str(model_dir)}  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Store:
    """``with S3Store() as store:`` moto's S3 server process on loopback (stopped on exit)."""

    def __init__(self, host: str = "127.0.0.1", prefix: Sequence[str] = ()) -> None:
        self.host = host
        self.prefix = list(prefix)
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a client (a node's engine) needs: the endpoint (pyarrow's and boto's variable) and credentials."""
        return {**S3_ENV, "AWS_ENDPOINT_URL_S3": self.endpoint}

    def __enter__(self) -> S3Store:
        argv = [*self.prefix, sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

        def answers() -> bool:
            assert self.proc is not None and self.proc.poll() is None, "moto's server exited"
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return True
            except OSError:
                return False

        wait_until(answers, what=f"moto's S3 server on {self.endpoint}", timeout=60)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"], region_name=S3_ENV["AWS_DEFAULT_REGION"])  # fmt: skip

    def upload(self, folder: Path, bucket: str, prefix: str) -> str:
        """Every file of ``folder`` under ``s3://bucket/prefix/``; returns that URI."""
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        for path in sorted(Path(folder).iterdir()):
            client.upload_file(str(path), bucket, f"{prefix}/{path.name}")
        return f"s3://{bucket}/{prefix}"
