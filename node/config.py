"""Node configuration: defaults < TOML file < environment < command-line flags.

``NodeConfig`` is a pydantic-settings ``BaseSettings``: its layers are pydantic-settings'
own sources (``TomlConfigSettingsSource`` for ``--config FILE``, ``EnvSettingsSource`` for
``INTELLECT_NODE_<FIELD>``, upper case; lists comma-separated) and keyword arguments for
flags, which ``node/cli/flags.py`` generates from the fields below (name, type, bounds,
description), so a setting is declared once. ``load_config`` merges them in that order.
This module imports only pydantic(-settings), so ``--help`` and ``--print-config`` stay instant.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from protocol.ids import ROLES, check_run_id

ENV_PREFIX = "INTELLECT_NODE_"
Role = Literal["bootstrap", "inference", "validator", "trainer"]
VerifyProfile = Literal["gpu-bf16", "paper", "strict-fp32"]  # crypto.verdict.PROFILES
assert set(ROLES) == set(Role.__args__)  # type: ignore[attr-defined]


class ConfigError(ValueError):
    """A configuration that cannot be used, with a message for the user."""


# a list from the environment is comma-separated text, not JSON (``_split_commas``)
Multiaddrs = Annotated[list[str], NoDecode]


TORCH_THREADS = (
    "Threads torch computes with in the engine's and the batch checker's processes (0: "
    "torch's default, one per core). Where several nodes share a machine's cores (the "
    "devnet), 1 each: more threads than cores spin against each other and burn CPU for nothing."
)


DEVICE = (
    "Inference and validator: where the engine and the batch checker compute (auto: the "
    "GPU when torch sees one, else the CPU). The dtype follows: bfloat16 on a GPU (float16 on "
    "one without bf16), float32 on a CPU; under verify_profile strict-fp32, float32 "
    "everywhere. A validator on the CPU judges a GPU worker's bf16 work in fp32 under "
    "gpu-bf16 (SPEC section 11.1)."
)


class CoreConfig(BaseSettings):
    """Every setting of a node but the DiLoCo group's (``NodeConfig`` adds those)."""

    model_config = SettingsConfigDict(
        extra="forbid", validate_assignment=True, env_prefix=ENV_PREFIX, case_sensitive=False
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
    run_id: str = Field(
        "devnet", description="The training run this node belongs to; other runs are rejected."
    )
    listen: Multiaddrs = Field(
        default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"],
        description="libp2p listen multiaddrs (TCP). Use a fixed port to be a stable bootstrap.",
        json_schema_extra={"metavar": "MULTIADDR"},
    )
    bootstrap: Multiaddrs = Field(
        default_factory=list,
        description="Multiaddrs (with /p2p/<id>) of peers to join through.",
        json_schema_extra={"metavar": "MULTIADDR"},
    )
    admin_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Local admin/metrics HTTP port on 127.0.0.1 (0: any free port).",
    )
    heartbeat_interval: float = Field(
        5.0, ge=0.1, le=300, description="Seconds between presence heartbeats on gossip."
    )
    peer_ttl: float = Field(
        30.0,
        ge=0.3,
        le=3600,
        description="A peer silent this many seconds is forgotten (a connected one is asked "
        "first); scaled up with the heartbeat interval when presence_rate lengthens it.",
    )
    presence_rate: float = Field(
        2.0,
        ge=0.01,
        le=1000,
        description="Presence heartbeats per second the whole network aims at: a node's "
        "heartbeat interval is max(heartbeat_interval, (known peers + 1) / presence_rate).",
    )
    discovery_interval: float = Field(
        5.0,
        ge=0.1,
        le=600,
        description="Seconds before the first DHT lookup round; rounds back off from there.",
    )
    discovery_max_interval: float = Field(
        300.0,
        ge=0.1,
        le=86400,
        description="Longest seconds between DHT lookup rounds once the roles a node works "
        "with are found (half of it while one is missing).",
    )
    conn_low: int = Field(
        6, ge=1, le=1000, description="Connections below which a node dials known peers."
    )
    conn_high: int = Field(
        12, ge=1, le=1000, description="Connections above which a node closes the surplus."
    )
    peers_per_role: int = Field(
        256, ge=1, le=100_000, description="Peers of each role the peer table holds at most."
    )
    read_timeout: float = Field(
        10.0, ge=0.05, le=600, description="Deadline in seconds for every remote read."
    )
    connect_timeout: float = Field(
        5.0, ge=0.05, le=600, description="Deadline in seconds for dialing a peer."
    )
    peer_max_streams: int = Field(16, ge=1, le=4096, description="Requests of a peer at once.")
    peer_request_rate: float = Field(100.0, ge=0.1, le=1e5, description="Requests/s of a peer.")
    peer_request_burst: int = Field(200, ge=1, le=10**6, description="Burst above that rate.")
    peer_presence_rate: float = Field(20.0, ge=0.1, le=1e5, description="Presence requests/s.")
    peer_presence_streams: int = Field(4, ge=1, le=4096, description="Presence requests at once.")
    peer_shun_cooldown: float = Field(10.0, ge=0, le=3600, description="Seconds unread if shunned.")
    max_clock_skew: float = Field(
        300.0, ge=1, le=86400, description="Messages whose timestamp is further off are stale."
    )
    gossip_rate: float = Field(
        100.0, ge=1, le=10000, description="Most announcements per second this node publishes."
    )
    gossip_queue: int = Field(
        10000, ge=16, le=1_000_000, description="Announcements that may wait for the pacer."
    )
    announce_buffer: int = Field(
        4096, ge=64, le=1_000_000, description="Own announcements kept for peers that missed them."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log verbosity."
    )
    chain: str = Field(
        "http://127.0.0.1:8545",
        description="The ledger's JSON-RPC URL (intellect-node chain serves one there).",
        json_schema_extra={"metavar": "URL"},
    )
    contract: str | None = Field(
        None,
        pattern=r"^0x[0-9a-fA-F]{40}$",
        description="The ledger contract's address.",
        json_schema_extra={"metavar": "ADDRESS"},
    )
    contract_block: int = Field(
        0, ge=0, description="The contract's deployment block (events are indexed from it)."
    )
    chain_id: int | None = Field(
        None, ge=1, description="Expected chain id; transactions are refused on any other chain."
    )
    chain_confirmations: int = Field(
        2,
        ge=0,
        le=1000,
        description="Blocks deep an event must be before the event index caches it.",
    )
    model: Path | None = Field(
        None,
        description="Local Hugging Face model directory for the inference, validator and "
        "trainer roles (the devnet passes the tiny base model).",
        json_schema_extra={"metavar": "DIR"},
    )
    verify_profile: VerifyProfile = Field(
        "gpu-bf16",
        description="How the run's work is verified: gpu-bf16 (workers in bf16, validators in "
        "bf16 or fp32), paper (the same with the TOPLOC paper's name), strict-fp32 (everyone "
        "in fp32: the CPU engine). Check one with `intellect-node model calibrate`.",
    )

    trainer_peer_id: str | None = Field(
        None,
        pattern=r"^[1-9A-HJ-NP-Za-km-z]{40,64}$",
        description="The run's trainer: weight manifests are accepted only under this key.",
        json_schema_extra={"metavar": "PEER_ID"},
    )
    async_level: int = Field(
        2,
        ge=0,
        le=64,
        description="A worker at trainer step n may use policy versions >= n - async_level.",
    )
    shard_size: int = Field(
        8 * 1024 * 1024,
        ge=64 * 1024,
        le=64 * 1024 * 1024,
        description="Bytes per weight shard in the manifests this node publishes.",
    )
    download_slots: int = Field(
        4, ge=1, le=64, description="Shards fetched at once (memory: this many shards)."
    )
    upload_slots: int = Field(
        4, ge=1, le=256, description="Shard uploads served at once; more are refused as busy."
    )
    upload_rate: float = Field(
        0.0, ge=0, le=100_000, description="Upload cap for weight shards in MB/s (0: none)."
    )
    follow_weights: bool | None = Field(
        None, description="Fetch every new weight version (default: every role but bootstrap)."
    )

    # ---- work (inference, validator and trainer roles) ----
    taskset: str = Field(
        "arithmetic", description="The run's task set (arithmetic, arithmetic:LO-HI, or a file)."
    )
    tasks_per_batch: int = Field(4, ge=1, le=256, description="Tasks in one rollout batch.")
    group_size: int = Field(4, ge=1, le=64, description="Samples per task (GRPO group size G).")
    max_new_tokens: int = Field(48, ge=1, le=16384, description="Tokens per sample at most.")
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature.")
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Nucleus sampling's top-p: workers sample with it, validators expect it "
        "(1: no nucleus; below, SPEC section 11.1's boundary events).",
    )
    engine_batch: int = Field(
        32, ge=1, le=1024, description="Sequences the engine decodes together."
    )
    torch_threads: int = Field(0, ge=0, le=1024, description=TORCH_THREADS)
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=DEVICE)
    stake: float = Field(
        2.0, gt=0, le=1e6, description="ETH an inference node stakes when it registers."
    )
    max_unjudged: int = Field(
        4,
        ge=1,
        le=1024,
        description="Submitted batches without a verdict after which a worker waits.",
    )
    # ---- training (trainer role) ----
    train_steps: int = Field(
        0, ge=0, description="Trainer: stop after this many training steps (0: never)."
    )
    batches_per_step: int = Field(
        2,
        ge=1,
        le=4096,
        description="Trainer: accepted batches one training step waits for.",
    )
    step_wait: float = Field(
        120.0,
        ge=0.5,
        le=86400,
        description="Trainer: seconds after which a step trains on the accepted batches it has "
        "(at least one) instead of waiting for batches_per_step.",
    )
    learning_rate: float | None = Field(
        None, gt=0, le=1, description="Trainer: AdamW learning rate (default: GRPO's default)."
    )
    train_procs: int = Field(
        1,
        ge=1,
        le=64,
        description="Trainer: processes its GRPO step runs in; above 1, torchrun ranks that "
        "shard the policy with FSDP2 (with train_device cuda, one per GPU of this machine). "
        "A DiLoCo member too (FSDP2 inside it, DiLoCo across members; with objective "
        "pretrain, pretrain_batch must be a multiple of it).",
    )
    train_device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Trainer: where the policy trains (cuda: NCCL between the ranks)."
    )
    seed: int = Field(0, ge=0, description="Trainer: the seed of its optimizer (torch RNG).")
    spot_check: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Share of each batch's rollouts a validator recomputes (SPEC §14).",
    )
    network_only: bool = Field(
        False,
        description="Join the network without doing the role's work (discovery, gossip, "
        "relaying only): for tests and measurements.",
    )

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

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, v: str) -> str:
        return check_run_id(v)

    @field_validator("listen", "bootstrap", mode="before")
    @classmethod
    def _split_commas(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [p.strip() for p in v.split(",") if p.strip()]
        return v

    @field_validator("listen", "bootstrap")
    @classmethod
    def _multiaddrs(cls, v: list[str], info: ValidationInfo) -> list[str]:
        return check_multiaddrs(v, bootstrap=info.field_name == "bootstrap")

    @model_validator(mode="after")
    def _ttl_above_heartbeat(self) -> Self:
        if self.peer_ttl <= self.heartbeat_interval:
            raise ValueError("peer_ttl must be longer than heartbeat_interval")
        return self

    @model_validator(mode="after")
    def _watermarks_in_order(self) -> Self:
        if self.conn_low > self.conn_high:
            raise ValueError("conn_low must not be above conn_high")
        return self

    @property
    def resolved_data_dir(self) -> Path:
        if self.data_dir is not None:
            return self.data_dir.expanduser()
        return default_data_dir(self.name or self.role)


def check_multiaddrs(addrs: list[str], *, bootstrap: bool) -> list[str]:
    """``addrs`` if each is a multiaddr a node can listen on (TCP) or, ``bootstrap``, dial
    (ending in ``/p2p/<peer id>``): a bad one is a config error before anything starts."""
    from multiaddr import Multiaddr

    for a in addrs:
        try:
            names = [p.name for p in Multiaddr(a).protocols()]
        except Exception as exc:  # multiaddr raises several unrelated types
            raise ValueError(f"{a!r} is not a multiaddr: {exc}") from None
        if not bootstrap and "tcp" not in names:
            raise ValueError(f"{a!r}: a node listens on TCP (/ip4/<address>/tcp/<port>)")
        if bootstrap and names[-1] != "p2p":
            raise ValueError(f"{a!r} must end in /p2p/<peer id> (the node's peer id)")
    return addrs


class NodeConfig(CoreConfig):
    """Every setting of a node. Constructed directly it takes its keyword arguments only;
    ``load_config`` adds the TOML file and the environment and reports errors for a user.
    The trainer's held-out evaluation and its DiLoCo group settings (SPEC §17) are declared
    here, after the others (one class of them all would be over 300 lines)."""

    diloco: bool = Field(
        False,
        description="Trainer: train in a DiLoCo group with the run's other trainers (SPEC "
        "§17.1): each takes inner steps on its share of the accepted batches, the group "
        "averages every diloco_inner_steps; the member trainer_peer_id names leads and "
        "publishes. A trainer started after its group formed (with an empty data_dir) joins "
        "it: it recovers the leader's state and is admitted at the next outer step.",
    )
    diloco_inner_steps: int = Field(
        4,
        ge=1,
        le=10_000,
        description="Trainer, DiLoCo: inner steps (H) per outer step: GRPO steps, each on its "
        "own slice of the member's samples of the step, or (objective pretrain) AdamW steps on "
        "the next batches of its shard.",
    )
    diloco_outer_lr: float = Field(
        0.7, gt=0, le=10, description="Trainer, DiLoCo: the outer (Nesterov SGD) learning rate."
    )
    diloco_momentum: float = Field(
        0.9, ge=0, le=0.99, description="Trainer, DiLoCo: the outer Nesterov momentum (0: none)."
    )
    diloco_quant: Literal["int8", "fp32"] = Field(
        "int8", description="Trainer, DiLoCo: encoding of pseudo-gradients in the all-reduce."
    )
    diloco_members: int = Field(
        1,
        ge=1,
        le=64,
        description="Trainer, DiLoCo (leader): members the group's first roster waits for.",
    )
    diloco_join_timeout: float = Field(
        120.0,
        ge=1,
        le=86_400,
        description="Trainer, DiLoCo (leader): seconds an outer step waits, once every member "
        "is there, for trainers that announced they are joining (they recover the group's "
        "state first: set it above that transfer's time; a joiner later than this comes in "
        "at a later step).",
    )

    diloco_admit: Multiaddrs = Field(
        default_factory=list,
        description="Trainer, DiLoCo (leader): peer ids of the members it admits to the group "
        "(comma-separated in the environment; empty: any trainer of the run).",
        json_schema_extra={"metavar": "PEER_ID"},
    )

    eval_every: int = Field(
        1,
        ge=0,
        le=100_000,
        description="Trainer: held-out evaluation every this many steps (0: never).",
    )
    heldout_per_level: int = Field(
        32, ge=1, le=10_000, description="Trainer: held-out tasks per difficulty level."
    )
    heldout_draws: int = Field(
        8,
        ge=1,
        le=1024,
        description="Trainer: seeded draws per held-out task at the run's temperature: the "
        "sampled accuracy (their mean reward, the headline figure) and pass@k with k this "
        "many; greedy accuracy is reported beside them.",
    )
    heldout_seed: int = Field(
        0,
        ge=0,
        description="Trainer: the seed that draws the held-out task set (the same set for "
        "every run that compares against another).",
    )

    objective: Literal["grpo", "pretrain"] = Field(
        "grpo",
        description="Trainer: what it trains on: grpo (the run's accepted rollouts) or "
        "pretrain (next-token loss on the text file data, in a DiLoCo group: needs diloco; "
        "SPEC §17.2).",
    )
    data: Path | None = Field(
        None,
        description="Trainer, pretrain: the UTF-8 text file to pretrain on (tokenized with "
        "the model's tokenizer; each member of the group reads its own contiguous shard).",
        json_schema_extra={"metavar": "PATH"},
    )
    pretrain_seq_len: int = Field(
        64, ge=2, le=1_000_000, description="Trainer, pretrain: tokens per training sequence."
    )
    pretrain_batch: int = Field(
        8,
        ge=1,
        le=4096,
        description="Trainer, pretrain: sequences per inner step (its AdamW learning rate is "
        "learning_rate, default 3e-4 with this objective).",
    )

    relay: bool | None = Field(
        None,
        description="Relay circuits (circuit relay v2 HOP) for nodes behind NAT while "
        "publicly reachable (SPEC §20). Default: on for the bootstrap role, off for others.",
    )
    relay_max_reservations: int = Field(
        64, ge=1, le=100_000, description="Relay: reservations held for other peers at most."
    )
    relay_reservation_ttl: int = Field(
        900, ge=30, le=86_400, description="Relay: seconds a reservation lasts (renewed before)."
    )
    relay_circuits_per_reservation: int = Field(
        8, ge=1, le=1024, description="Relay: circuits open at once to one reserved peer."
    )
    relay_circuits_per_peer: int = Field(
        4, ge=1, le=1024, description="Relay: circuits one peer may open through us at once."
    )
    relay_circuit_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        le=2**40,
        description="Relay: bytes one circuit may carry (both ways) before it is cut.",
    )
    relay_circuit_seconds: int = Field(
        600, ge=1, le=86_400, description="Relay: seconds a circuit may last before it is cut."
    )

    @field_validator("diloco_admit", mode="before")
    @classmethod
    def _admit_commas(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [p.strip() for p in v.split(",") if p.strip()]
        return v

    @model_validator(mode="after")
    def _pretrain_batch_splits_over_the_ranks(self) -> Self:
        if self.objective == "pretrain" and self.pretrain_batch % self.train_procs:
            raise ValueError(
                f"pretrain_batch {self.pretrain_batch} does not split over train_procs "
                f"{self.train_procs}: each rank trains on pretrain_batch / train_procs "
                "sequences of every inner step; make it a multiple"
            )
        return self

    @model_validator(mode="after")
    def _pretrain_needs_a_group_and_data(self) -> Self:
        if self.objective == "pretrain" and not self.diloco:
            raise ValueError(
                "objective pretrain trains in a DiLoCo group: add diloco = true (--diloco; "
                "a group of one, diloco_members = 1, trains alone)"
            )
        if self.objective == "pretrain" and self.data is None:
            raise ValueError("objective pretrain needs the text to train on: data = PATH (--data)")
        if self.data is not None and self.objective != "pretrain":
            raise ValueError("data is the pretraining corpus: it needs objective = pretrain")
        return self


def default_data_dir(name: str) -> Path:
    """Where a node named ``name`` keeps its files unless ``data_dir`` says otherwise (what
    ``--name`` means to the commands that talk to a running node)."""
    return Path.home() / ".intellect-node" / name


def load_config(
    *,
    file: Path | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> NodeConfig:
    """Merge defaults < the TOML ``file`` < the environment (``environ``, default
    ``os.environ``) < ``flags`` (a None value = not given); a ``ConfigError`` names every
    setting that is wrong."""
    layers: list[dict[str, Any]] = []
    if file is not None:
        if not Path(file).is_file():
            raise ConfigError(f"config file not found: {file}")
        try:
            layers.append(TomlConfigSettingsSource(NodeConfig, toml_file=Path(file))())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {file} is not valid TOML: {exc}") from exc
    env = EnvSettingsSource(NodeConfig)
    if environ is not None:
        env.env_vars = {k.lower(): v for k, v in environ.items()}  # case-insensitive, as os's
    try:
        layers.append(env())
    except SettingsError as exc:  # a value pydantic-settings cannot parse
        raise ConfigError(f"invalid configuration in the environment: {exc}") from exc
    layers.append({k: v for k, v in (flags or {}).items() if v is not None})
    merged = {k: v for layer in layers for k, v in layer.items()}
    try:
        # model_validate: exactly these layers (the constructor would read os.environ again)
        return NodeConfig.model_validate(merged)
    except ValidationError as exc:
        lines = [f"  {'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from exc


def config_toml(cfg: NodeConfig) -> str:
    """The resolved config as TOML (what ``--print-config`` shows)."""
    lines = []
    for name in NodeConfig.model_fields:
        value = getattr(cfg, name)
        if name == "data_dir":
            value = str(cfg.resolved_data_dir)
        if value is None:
            continue
        if isinstance(value, Path):
            value = str(value)
        if isinstance(value, bool):
            lines.append(f"{name} = {str(value).lower()}")
        elif isinstance(value, list):
            lines.append(f"{name} = [{', '.join(_toml_str(v) for v in value)}]")
        elif isinstance(value, str):
            lines.append(f"{name} = {_toml_str(value)}")
        else:
            lines.append(f"{name} = {value}")
    return "\n".join(lines) + "\n"


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
