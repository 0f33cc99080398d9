"""The run's sections: ``[run]`` (what every worker and validator must agree on with the
run), ``[chain]`` (the ledger), ``[engine]`` (where generation and checking compute),
``[inference]`` and ``[validator]`` (each role's own)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from node.config.section import Section
from protocol.ids import check_run_id

VerifyProfile = Literal["gpu-bf16", "paper", "strict-fp32"]  # crypto.verdict.PROFILES


class RunConfig(Section):
    """What every node of a run must agree on with it: a validator checks a batch against
    the run's model, tasks, sampling and verification profile."""

    id: str = Field(
        "devnet",
        description="The training run this node belongs to; other runs are rejected.",
        json_schema_extra={"was": "run_id", "flag": "--run-id"},
    )
    manifest_name: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9_-]{0,30}$",
        description="The trainer: sign and serve a run manifest (SPEC §2) under this name; "
        "the run id becomes <name>-<the manifest's hash>, which workers and validators "
        "join by (--run-id, or the only run their bootstrap knows).",
        json_schema_extra={"metavar": "NAME"},
    )
    trainer_peer_id: str | None = Field(
        None,
        pattern=r"^[1-9A-HJ-NP-Za-km-z]{40,64}$",
        description="The run's trainer: weight manifests are accepted only under this key.",
        json_schema_extra={"metavar": "PEER_ID"},
    )
    model: Path | None = Field(
        None,
        description="Local Hugging Face model directory for the inference, validator and "
        "trainer roles (the devnet passes the tiny base model).",
        json_schema_extra={"metavar": "DIR", "flag": "--model"},
    )
    verify_profile: VerifyProfile = Field(
        "gpu-bf16",
        description="How the run's work is verified: gpu-bf16 (workers in bf16, validators in "
        "bf16 or fp32), paper (the same with the TOPLOC paper's name), strict-fp32 (everyone "
        "in fp32: the CPU engine). Check one with `intellect-node model calibrate`.",
    )
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
        "(1: no nucleus; below, SPEC section 18.1's boundary events).",
    )
    async_level: int = Field(
        2,
        ge=0,
        le=64,
        description="A worker at trainer step n may use policy versions >= n - async_level.",
    )

    @field_validator("id")
    @classmethod
    def _run_id(cls, v: str) -> str:
        return check_run_id(v)


class ChainConfig(Section):
    """The ledger's chain and contract (inference, validator and trainer roles).
    `intellect-node chain` prints them for the local development chain, and writes them to
    `~/.intellect-node/chain/chain.json`."""

    url: str = Field(
        "http://127.0.0.1:8545",
        description=(
            "The ledger's JSON-RPC URL, or several separated by commas: each request goes "
            "to the next when one fails (intellect-node chain serves one)."
        ),
        json_schema_extra={"metavar": "URL[,URL...]", "was": "chain", "flag": "--chain"},
    )
    public_url: str | None = Field(
        None,
        pattern=r"^https?://[\x21-\x7e]{1,248}(,https?://[\x21-\x7e]{1,248}){0,3}$",
        description=(
            "The trainer of a run manifest: the chain's public JSON-RPC URLs (up to 4, "
            "separated by commas) its manifest suggests to a joining node given no chain URL "
            "(checked there against the run's chain id and contract). The node's own url is "
            "never sent: it may hold an API key."
        ),
        json_schema_extra={"metavar": "URL[,URL...]"},
    )
    contract: str | None = Field(
        None,
        pattern=r"^0x[0-9a-fA-F]{40}$",
        description="The ledger contract's address.",
        json_schema_extra={"metavar": "ADDRESS", "flag": "--contract"},
    )
    contract_block: int = Field(
        0, ge=0, description="The contract's deployment block (events are indexed from it)."
    )
    id: int | None = Field(
        None,
        ge=1,
        description="Expected chain id; transactions are refused on any other chain.",
        json_schema_extra={"was": "chain_id"},
    )
    confirmations: int | None = Field(
        None,
        ge=0,
        le=1000,
        description=(
            "Blocks on top of a transaction's or an event's before the node counts it done or "
            "acts on it (default per chain id: 0 on development chains, 10 on the main L2s, "
            "6 on an unknown chain); deeper than any reorg the chain has."
        ),
        json_schema_extra={"was": "chain_confirmations"},
    )
    max_fee_gwei: float = Field(
        1000.0,
        gt=0,
        le=1_000_000,
        description=(
            "Most the node pays per gas (gwei): a transaction the chain asks more for waits "
            "instead of being replaced with higher fees."
        ),
    )
    replace_after_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description=(
            "Seconds a transaction may stay unmined before it is replaced (same nonce) with "
            "the fees the latest block asks."
        ),
    )
    rpc_timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description=(
            "Seconds one JSON-RPC request may take before it is tried on the next URL (a "
            "provider that holds requests stalls every transaction that long)."
        ),
    )
    tx_timeout_s: float = Field(
        120.0,
        gt=0,
        le=86_400,
        description=(
            "Seconds a transaction is followed to its confirmations before the call gives up "
            "(the transaction is kept and sent again before the account's next)."
        ),
    )
    password_file: Path | None = Field(
        None,
        description=(
            "File holding the password of the node's EVM keystore (else "
            "INTELLECT_NODE_PASSWORD, else a prompt), as the ledger commands' --password-file."
        ),
        json_schema_extra={"metavar": "FILE", "flag": "--password-file", "was": None},
    )

    @field_validator("url")
    @classmethod
    def _urls(cls, v: str) -> str:
        urls = [u.strip() for u in v.split(",")]
        bad = [u for u in urls if u != "embedded" and not u.startswith(("http://", "https://"))]
        if bad or ("embedded" in urls and len(urls) > 1):
            raise ValueError(
                f"{bad[0] if bad else v!r} is not a JSON-RPC URL: give http(s):// URLs, "
                "separated by commas"
            )
        return ",".join(urls)


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
    "gpu-bf16 (SPEC section 18.1)."
)


class EngineConfig(Section):
    """The inference engine and the validator's batch checker: where and how they compute."""

    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=DEVICE)
    torch_threads: int = Field(0, ge=0, le=1024, description=TORCH_THREADS)
    batch: int = Field(
        32,
        ge=1,
        le=1024,
        description="Sequences the engine decodes together.",
        json_schema_extra={"was": "engine_batch"},
    )


class InferenceConfig(Section):
    """The inference role: its stake and how far it works ahead of the validators."""

    stake: float = Field(
        2.0, gt=0, le=1e6, description="ETH an inference node stakes when it registers."
    )
    max_unjudged: int = Field(
        4,
        ge=1,
        le=1024,
        description="Submitted batches without a verdict after which a worker waits.",
    )


class ValidatorConfig(Section):
    """The validator role: which batches it judges and how much of each it recomputes."""

    spot_check: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Share of each batch's rollouts a validator recomputes (SPEC §18).",
    )
    judge: Literal["all", "assigned"] = Field(
        "all",
        description="Which submissions this validator judges: all, or those assigned to it "
        "(each to quorum + 1 of the run's validators, ranked by the submission's block "
        "hash; the next quorum + 1 take it later if no verdict stands: SPEC §19). "
        "Assigned, validators add capacity; a run with more validators than quorum + 1 "
        "needs it to keep up.",
    )
