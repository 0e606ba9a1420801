from oxrl.config.load import ConfigError, load_config, save_config
from oxrl.config.schema import Config

__all__ = ["Config", "ConfigError", "load_config", "save_config"]
