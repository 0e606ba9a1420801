"""The config: its schema (schema.py), how a YAML file and overrides become one (load.py), and the names it knows
(names.py). The names below are imported on first use, so that `oxrl.config.names` (which the CLI's parser reads)
loads no pydantic schema."""

__all__ = ["Config", "ConfigError", "load_config", "save_config"]


def __getattr__(name: str):
    if name == "Config":
        from oxrl.config.schema import Config

        return Config
    if name in ("ConfigError", "load_config", "save_config"):
        from oxrl.config import load

        return getattr(load, name)
    raise AttributeError(f"module 'oxrl.config' has no attribute {name!r}")
