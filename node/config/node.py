"""``NodeConfig``: who the node is (top-level keys) and one typed section per part of it.

Cross-section checks live here; a section's own checks live with it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from node.config.network import AdminConfig, NetConfig, RelayConfig, ShardcastConfig
from node.config.training import DilocoConfig, TrainerConfig
from node.config.work import (
    ChainConfig,
    EngineConfig,
    InferenceConfig,
    RunConfig,
    ValidatorConfig,
)
from protocol.ids import ROLES

ENV_PREFIX = "INTELLECT_NODE_"
ENV_NESTED = "__"  # INTELLECT_NODE_NET__HEARTBEAT_INTERVAL
Role = Literal["bootstrap", "inference", "validator", "trainer"]
assert set(ROLES) == set(Role.__args__)  # type: ignore[attr-defined]


class NodeConfig(BaseSettings):
    """Every setting of a node. Constructed directly it takes its keyword arguments only
    (a section as its model or a dict); ``load_config`` adds the TOML file and the
    environment and reports errors for a user."""

    model_config = SettingsConfigDict(
        extra="forbid",
        validate_assignment=True,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED,
        case_sensitive=False,
    )

    role: Role = Field("inference", description="What this node does in the run.")
    name: str | None = Field(
        None, description="Node name; picks the default data dir. Default: the role."
    )
    data_dir: Path | None = Field(
        None,
        description="Identity, admin port file and state. Default ~/.intellect-node/<name>.",
        json_schema_extra={"metavar": "DIR"},
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log verbosity."
    )
    network_only: bool = Field(
        False,
        description="Join the network without doing the role's work (discovery, gossip, "
        "relaying only): for tests and measurements.",
    )
    # model_validate({}): the defaults (mypy, without the pydantic plugin, reads
    # Field(default, ...) as no default, so a bare RunConfig() would not type-check)
    run: RunConfig = Field(default_factory=lambda: RunConfig.model_validate({}))
    net: NetConfig = Field(default_factory=lambda: NetConfig.model_validate({}))
    relay: RelayConfig = Field(default_factory=lambda: RelayConfig.model_validate({}))
    chain: ChainConfig = Field(default_factory=lambda: ChainConfig.model_validate({}))
    shardcast: ShardcastConfig = Field(default_factory=lambda: ShardcastConfig.model_validate({}))
    engine: EngineConfig = Field(default_factory=lambda: EngineConfig.model_validate({}))
    inference: InferenceConfig = Field(default_factory=lambda: InferenceConfig.model_validate({}))
    validator: ValidatorConfig = Field(default_factory=lambda: ValidatorConfig.model_validate({}))
    admin: AdminConfig = Field(default_factory=lambda: AdminConfig.model_validate({}))
    trainer: TrainerConfig = Field(default_factory=lambda: TrainerConfig.model_validate({}))
    diloco: DilocoConfig = Field(default_factory=lambda: DilocoConfig.model_validate({}))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only the keyword arguments: ``load_config`` layers the TOML file and the
        environment itself, so a ``NodeConfig(...)`` built in code (tests, benches) does not
        pick up whatever ``INTELLECT_NODE_*`` variables the shell happens to hold."""
        return (init_settings,)

    @model_validator(mode="after")
    def _pretrain_trains_in_a_group(self) -> Self:
        if self.trainer.objective == "pretrain" and not self.diloco.enabled:
            raise ValueError(
                "trainer.objective pretrain trains in a DiLoCo group: add [diloco] enabled = "
                "true (--diloco.enabled; a group of one, members = 1, trains alone)"
            )
        return self

    def changed(self, settings: Mapping[str, Any]) -> Self:
        """A copy with ``settings`` (by place: ``{"run.async_level": 1}``) changed, checked
        as a load is (``model_copy`` would check nothing)."""
        data = self.model_dump()
        for path, value in settings.items():
            section, _, name = path.rpartition(".")
            (data[section] if section else data)[name] = value
        return self.model_validate(data)

    @property
    def resolved_data_dir(self) -> Path:
        if self.data_dir is not None:
            return self.data_dir.expanduser()
        return default_data_dir(self.name or self.role)


def default_data_dir(name: str) -> Path:
    """Where a node named ``name`` keeps its files unless ``data_dir`` says otherwise (what
    ``--name`` means to the commands that talk to a running node)."""
    return Path.home() / ".intellect-node" / name
