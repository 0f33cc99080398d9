"""Node configuration: defaults < TOML file < environment < command-line flags.

``NodeConfig`` (``node.py``) holds the top-level keys (role, name, data_dir, log_level,
network_only) and one typed section per part of a node, each its own pydantic model with its
own checks: ``[run]``, ``[chain]``, ``[engine]``, ``[inference]``, ``[validator]``
(``work.py``), ``[net]``, ``[relay]``, ``[shardcast]``, ``[admin]`` (``network.py``),
``[trainer]``, ``[diloco]`` (``training.py``). A setting is declared once, there; every
other spelling is derived from it (``places.py``): the TOML key ``[net] heartbeat_interval``,
the environment variable ``INTELLECT_NODE_NET__HEARTBEAT_INTERVAL`` (pydantic-settings'
nested delimiter; lists comma-separated), the flag ``--net.heartbeat-interval`` that
``node/cli/flags.py`` generates, and the configuration reference. ``load_config``
(``loading.py``) merges the layers. This package imports only pydantic(-settings), so
``--help`` and ``--print-config`` stay instant.
"""

from node.config.loading import ConfigError, config_toml, load_config
from node.config.network import (
    AdminConfig,
    NetConfig,
    RelayConfig,
    ShardcastConfig,
    check_multiaddrs,
)
from node.config.node import ENV_NESTED, ENV_PREFIX, NodeConfig, Role, default_data_dir
from node.config.places import Setting, by_path, moved, section_models, settings
from node.config.section import Multiaddrs, Section
from node.config.training import DilocoConfig, TrainerConfig
from node.config.work import (
    ChainConfig,
    EngineConfig,
    InferenceConfig,
    RunConfig,
    ValidatorConfig,
    VerifyProfile,
)

__all__ = [
    "ENV_NESTED",
    "ENV_PREFIX",
    "AdminConfig",
    "ChainConfig",
    "ConfigError",
    "DilocoConfig",
    "EngineConfig",
    "InferenceConfig",
    "Multiaddrs",
    "NetConfig",
    "NodeConfig",
    "RelayConfig",
    "Role",
    "RunConfig",
    "Section",
    "Setting",
    "ShardcastConfig",
    "TrainerConfig",
    "ValidatorConfig",
    "VerifyProfile",
    "by_path",
    "check_multiaddrs",
    "config_toml",
    "default_data_dir",
    "load_config",
    "moved",
    "section_models",
    "settings",
]
