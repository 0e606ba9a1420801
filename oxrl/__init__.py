"""oxRL: small, readable, correct post-training for language models."""

__version__ = "0.1.0"

__all__ = ["Trainer", "__version__"]


def __getattr__(name: str):
    # Imported lazily so `import oxrl` stays cheap (no torch/transformers until needed).
    if name == "Trainer":
        from oxrl.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'oxrl' has no attribute {name!r}")
