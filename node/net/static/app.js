// The node dashboard: one panel per node, drawn from the node's own GET endpoints
// (/status live through /events or polling, /history for the rewards panel). It only
// reads: it never holds the admin token. Every figure carries data-k (its path in
// /status, or history.*) and data-value (the raw value), which the browser test compares
// with `intellect-node status --json` and the chain's events.
"use strict";
(function () {
  const POLL_MS = 1000, HISTORY_MS = 10000, KEEP = 120;
  // a refused /events stream is asked for again after RETRY_MS, doubled up to RETRY_MAX_MS;
  // after SILENT_MS with no answer at all, the panel says the node is gone
  const RETRY_MS = 1000, RETRY_MAX_MS = 30000, SILENT_MS = 10000;
  const COLORS = { accepted: "#2e9e5b", invalid: "#d64545", mismatch: "#e08a2e", unavailable: "#8a6bd1", rejected: "#d64545" };

  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);
    return e;
  }
  function svg(cls) {
    const s = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    s.setAttribute("class", "chart " + (cls || ""));
    return s;
  }
  function get(obj, path) {
    return path.split(".").reduce((o, k) => (o === null || o === undefined ? undefined : o[k]), obj);
  }
  const int = (v) => (v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US"));
  const eth = (v) => (v === null || v === undefined ? "–" : (Number(v) / 1e18).toFixed(6) + " ETH");
  const secs = (v) => (v === null || v === undefined ? "–" : Number(v).toFixed(2) + " s");
  const num = (v, d) => (v === null || v === undefined ? "–" : Number(v).toFixed(d === undefined ? 3 : d));
  function bytes(v) {
    if (v === null || v === undefined) return "–";
    const u = ["B", "KiB", "MiB", "GiB"]; let i = 0; v = Number(v);
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : String(v)) + " " + u[i];
  }
  const short = (id) => (id && id.length > 16 ? id.slice(0, 8) + "…" + id.slice(-6) : id || "–");

  // a figure: big value, small label; data-k / data-value for the test
  function fig(label, key, fmt) {
    const v = h("span", { class: "v", "data-k": key }, "–");
    v.fmt = fmt || int;
    return h("div", { class: "fig" }, v, h("span", { class: "l" }, label));
  }
  function card(title, ...body) {
    return h("section", { class: "card" }, h("h3", {}, title), ...body);
  }
  function wide(c) { c.classList.add("wide"); return c; }
  function legend(...items) {
    return h("div", { class: "legend" }, ...items.flatMap(([color, text]) => [h("span", { class: "sw", style: "background:" + color }), text + " "]));
  }
  function figs(...items) { return h("div", { class: "figs" }, ...items); }

  // /status's reachability section in words (SPEC §16); the field name is the label's title
  const REACH_LABELS = {
    state: "state",
    advertised: "listening on",
    observed: "seen from outside as",
    reached_by: "peers that dialed back",
    not_reached_by: "peers that could not dial back",
    unanswered: "questions unanswered",
    answered: "dial-backs made for others",
  };

  // a value as a person reads it: a list joined, a count map as "reached 12 · busy 1"
  function plain(v) {
    if (Array.isArray(v)) return v.join(" ") || "none";
    if (v && typeof v === "object") {
      const parts = Object.entries(v).map(([k, n]) => `${k.replace(/_/g, " ")} ${typeof n === "object" ? plain(n) : n}`);
      return parts.join(" · ") || "none";
    }
    return v === null || v === undefined ? "–" : String(v);
  }

  // The devnet's page: one line per node above the panels (role, answering or not, the
  // version it holds, what it did), each a link to its panel below.
  class Summary {
    constructor(el, nodes) {
      this.el = el;
      this.rows = {};
      const body = h("tbody", {});
      for (const n of nodes) {
        const row = h("tr", { "data-summary": n.name });
        this.rows[n.name] = row;
        body.append(row);
        this.fill(n.name, null);
      }
      el.append(h("table", { class: "summary" },
        h("thead", {}, h("tr", {}, ...["node", "role", "state", "version held", "work"].map((t) => h("th", {}, t)))),
        body));
      el.hidden = false;
    }

    fill(name, st, ok = true) {
      const row = this.rows[name];
      if (!row) return;
      const link = h("a", { href: "#node-" + encodeURIComponent(name) }, name);
      if (!st) { row.replaceChildren(h("td", {}, link), h("td", { class: "muted", colspan: "4" }, "connecting…")); return; }
      const cell = (k, v, text) => h("td", { "data-k": k, "data-value": JSON.stringify(v ?? null) }, text ?? plain(v));
      row.classList.toggle("offline", !ok);
      row.replaceChildren(
        h("td", {}, link),
        cell("role", st.role, st.role),
        h("td", {}, ok ? "answering" : "not answering"),
        cell("weights.current", (st.weights || {}).current),
        h("td", {}, work(st)));
    }
  }

  function work(st) {
    const w = st.inference, v = st.validator, t = st.trainer;
    if (w) return `${w.accepted} accepted, ${w.rejected} rejected, ${w.unjudged} waiting`;
    if (v) return `judged ${v.judged}: ${v.accepted} accepted`;
    if (t) return `step ${t.step}` + (t.train_steps ? ` of ${t.train_steps}` : "");
    return `${st.peer_count} peers known`;
  }

  let summary = null;  // the devnet page's Summary, or none (one node's own page)

  class NodePanel {
    constructor(root, spec) {
      this.spec = spec;
      this.base = spec.base || "";
      this.el = h("article", { class: "node", "data-node": spec.name || "", id: "node-" + (spec.name || "") });
      root.append(this.el);
      this.role = null;
      this.tps = [];
      this.status = null;
      this.history = null;
      this.lastJudged = -1;
      this.heard = Date.now();  // when the node last answered (or the page opened)
      this.notice = h("p", { class: "notice" });
      this.notice.hidden = true;
      this.el.append(this.notice, h("p", { class: "muted" }, "connecting to " + (spec.name || "this node") + "…"));
    }

    build(role) {
      this.role = role;
      this.el.replaceChildren(this.notice);
      this.head = h("header", { class: "nodehead" });
      this.el.append(this.head);
      const grid = h("div", { class: "grid" });
      this.el.append(grid);
      this.peers = h("div", { class: "chips", "data-k": "peers_by_role" });
      this.reach = h("dl", { class: "kv" });
      grid.append(card("Network",
        figs(fig("peers known", "peer_count"), fig("connections", "connections.count")),
        h("h4", {}, "Peers by role"), this.peers,
        h("h4", {}, "Reachability"), this.reach));
      this.downloads = h("div", { class: "downloads" });
      grid.append(card("Policy weights (SHARDCAST)",
        figs(fig("version held", "weights.current"), fig("newest known", "weights.newest_known"),
          fig("uploads active", "weights.uploads_active"),
          fig("uploaded", "weights.uploaded_bytes", bytes), fig("downloaded", "weights.downloaded_bytes", bytes)),
        h("h4", {}, "Transfers"), this.downloads));
      if (role === "inference") this.buildWorker(grid);
      if (role === "validator") this.buildValidator(grid);
      if (role === "trainer") this.buildTrainer(grid);
      if (role === "inference" || role === "validator") this.buildRewards(grid);
      if (role !== "bootstrap") this.buildChain(grid);
    }

    buildWorker(grid) {
      this.reasons = h("div", { class: "chips", "data-k": "inference.rejected_by_reason" });
      this.tpsChart = svg("small");
      grid.append(card("Work",
        figs(fig("generated", "inference.generated"), fig("submitted", "inference.submitted"),
          fig("accepted", "inference.accepted"), fig("rejected", "inference.rejected"),
          fig("waiting for a verdict", "inference.unjudged"), fig("policy version used", "inference.version_used")),
        h("h4", {}, "Rejected, by reason"), this.reasons,
        figs(fig("tokens / s", "inference.tokens_per_s", (v) => num(v, 1)), fig("tokens", "inference.tokens")),
        this.tpsChart));
      grid.append(card("Stake and rewards",
        figs(fig("stake", "inference.stake_wei", eth), fig("locked as collateral", "inference.locked_wei", eth),
          fig("pending rewards", "inference.pending_wei", eth), fig("claimable rewards", "inference.claimable_wei", eth),
          fig("times slashed", "inference.slashed"))));
    }

    buildValidator(grid) {
      this.reasons = h("div", { class: "chips", "data-k": "validator.rejected_by_reason" });
      this.verdictChart = svg("small");
      this.recent = h("tbody");
      grid.append(card("Verdicts",
        figs(fig("judged", "validator.judged"), fig("accepted", "validator.accepted"), fig("rejected", "validator.rejected"),
          fig("backlog: waiting", "validator.waiting"), fig("backlog: unposted", "validator.unposted"),
          fig("fetch failures", "validator.fetch_failures")),
        h("h4", {}, "By reason"), this.reasons, this.verdictChart));
      grid.append(card("Verdict latency (seen on-chain → posted)",
        figs(fig("last", "validator.latency_s.last", secs), fig("mean", "validator.latency_s.mean", secs),
          fig("p95", "validator.latency_s.p95", secs), fig("max", "validator.latency_s.max", secs)),
        h("table", { class: "rows" }, h("thead", {}, h("tr", {}, h("th", {}, "worker"), h("th", {}, "batch"), h("th", {}, "verdict"), h("th", {}, "latency"))), this.recent)));
    }

    buildTrainer(grid) {
      this.curve = svg("wide");
      this.batchChart = svg("wide");
      grid.append(card("Training",
        figs(fig("step", "trainer.step"), fig("train steps", "trainer.train_steps", (v) => (v ? int(v) : "no limit")), fig("policy version", "trainer.policy_version"),
          fig("batches used", "trainer.batches_used"), fig("usable now", "trainer.usable"), fig("tokens trained", "trainer.tokens_trained"),
          fig("accepted", "trainer.accepted"), fig("rejected", "trainer.rejected"))));
      grid.append(wide(card("Learning curve",
        legend(["#4f7cff", "reward (mean)"], ["#2e9e5b", "held-out accuracy, sampled"], ["#a3c9b0", "held-out accuracy, greedy"]),
        this.curve, h("h4", {}, "Batches used per step"), this.batchChart)));
    }

    buildChain(grid) {
      // the ledger client's own figures (ledger/rpc.py, ledger/transactions.py)
      this.rpcRows = h("tbody");
      grid.append(card("Chain: transactions and RPC providers",
        figs(fig("sent", "chain.transactions.sent"), fig("confirmed", "chain.transactions.confirmed"),
          fig("replaced (fees)", "chain.transactions.replaced"), fig("sent again", "chain.transactions.resent"),
          fig("removed by a reorg", "chain.transactions.reorged"), fig("held at the fee cap", "chain.transactions.fee_capped"),
          fig("timed out", "chain.transactions.pending")),
        h("table", { class: "rows" }, h("thead", {}, h("tr", {}, ...["RPC URL", "answers", "refused", "rate limited", "server errors", "unreachable", "bad answers"].map((t) => h("th", {}, t)))), this.rpcRows)));
    }

    updateChain(c) {
      if (!this.rpcRows) return;
      const rows = (c && c.rpc) || [];
      this.rpcRows.replaceChildren(...(rows.length ? rows.map((r) => h("tr", { title: r.last_fault || "" },
        h("td", {}, h("code", {}, r.url + (r.current ? " (in use)" : ""))), ...["ok", "refusal", "rate_limit", "server", "unreachable", "bad_answer"].map((k) => h("td", {}, int(r[k])))))
        : [h("tr", {}, h("td", { class: "muted" }, c ? "in-process chain: no RPC" : "the ledger is not open yet"))]));
    }

    buildRewards(grid) {
      this.histFigs = figs(fig("submissions", "history.count.submission"), fig("verdicts", "history.count.verdict"),
        fig("slashes", "history.count.slash"), fig("claims", "history.count.claim"), fig("stake changes", "history.count.stake"));
      this.histChart = svg("wide");
      this.histRows = h("tbody");
      this.histDays = h("tbody");
      this.histNote = h("p", { class: "muted" }, "reading the chain…");
      this.lives = h("tbody");
      this.disagree = h("ul", { class: "disagreements" });
      grid.append(wide(card("Account history (from the chain's events)", this.histNote, this.histFigs,
        legend(["#4f7cff", "submissions"], ["#2e9e5b", "verdicts"]), this.histChart,
        h("table", { class: "rows" },
          h("colgroup", {}, h("col", { style: "width:12%" }), h("col", { style: "width:24%" }), h("col", { style: "width:24%" }), h("col", {})),
          h("thead", {}, h("tr", {}, h("th", {}, "block"), h("th", {}, "event"), h("th", {}, "amount"), h("th", {}, "detail"))), this.histRows),
        h("h4", {}, "Per day (UTC; amounts in ETH)"),
        h("table", { class: "rows days" },
          h("thead", {}, h("tr", {}, ...["day", "subm.", "acc.", "rej.", "judged", "slashed", "settled", "claimed", "staked"].map((t) => h("th", {}, t)))),
          this.histDays),
        h("h4", {}, "Batches: each stage's block and transaction"),
        h("table", { class: "rows" },
          h("thead", {}, h("tr", {}, ...["batch", "submitted", "verdicts", "settled", "claimed"].map((t) => h("th", {}, t)))), this.lives),
        h("h4", {}, "The node against the chain"), this.disagree)));
    }

    setFigures(data, prefix) {
      for (const v of this.el.querySelectorAll(".fig .v[data-k]")) {
        const k = v.getAttribute("data-k");
        if (prefix ? !k.startsWith(prefix) : k.startsWith("history.")) continue;
        const val = get(data, prefix ? k.slice(prefix.length) : k);
        v.setAttribute("data-value", JSON.stringify(val === undefined ? null : val));
        v.textContent = v.fmt(val);
      }
    }

    chips(el, counts, colorOf) {
      const entries = Object.entries(counts || {});
      el.setAttribute("data-value", JSON.stringify(counts || {}));
      el.replaceChildren(...(entries.length ? entries.map(([k, n]) =>
        h("span", { class: "chip", style: colorOf ? `border-color:${colorOf(k)}` : "" }, k + " ", h("b", {}, int(n))))
        : [h("span", { class: "muted" }, "none")]));
    }

    update(st) {
      this.status = st;
      if (this.role !== st.role) this.build(st.role);
      this.head.replaceChildren(
        h("span", { class: "role " + st.role }, st.role),
        h("span", { class: "name" }, this.spec.name || ""),
        h("code", { title: st.peer_id, "data-k": "peer_id" }, short(st.peer_id)),
        h("span", { class: "muted" }, "run " + st.run_id),
        ...((st.inference || st.validator) ? [h("code", { class: "muted", title: "ledger account" }, (st.inference || st.validator).address)] : []));
      this.setFigures(st, null);
      this.chips(this.peers, st.peers_by_role);
      this.reach.replaceChildren();
      const reach = st.reachability || null;
      const pairs = reach && typeof reach === "object" ? Object.entries(reach) :
        [["listening on", (st.addrs || []).join(" ")], ["connections", `${st.connections.count} (keeps ${st.connections.low}–${st.connections.high})`],
          ["dialed / dropped", `${st.connections.dialed} / ${st.connections.dropped}`], ["reachability", "not reported by this node"]];
      for (const [k, v] of pairs) {
        // the state is a figure the browser test compares with /status (SPEC §16)
        const attrs = reach && k === "state" ? { "data-k": "reachability.state", "data-value": JSON.stringify(v) } : {};
        this.reach.append(h("dt", { title: k }, REACH_LABELS[k] || k.replace(/_/g, " ")), h("dd", attrs, plain(v)));
      }
      const dl = Object.entries(st.weights.downloading || {});
      this.downloads.replaceChildren(...(dl.length ? dl.map(([ver, prog]) => {
        const [done, total] = prog.split("/").map(Number);
        return h("div", { class: "transfer" }, h("span", {}, `v${ver}`),
          h("progress", { max: String(total || 1), value: String(done || 0) }), h("span", {}, prog + " shards"));
      }) : [h("span", { class: "muted" }, `no download in progress; holds ${JSON.stringify((st.inference || {}).weights_held || st.weights.held || [])}`)]));
      if (st.inference) this.updateWorker(st.inference);
      if (st.validator) this.updateValidator(st.validator);
      if (st.trainer) this.updateTrainer(st.trainer);
      this.updateChain(st.chain);
    }

    updateWorker(w) {
      this.chips(this.reasons, w.rejected_by_reason, (k) => COLORS[k] || "#999");
      this.tps.push([Date.now() / 1000, w.tokens_per_s]);
      if (this.tps.length > KEEP) this.tps.shift();
      const t0 = this.tps[0][0];
      Charts.line(this.tpsChart, [{ name: "tokens/s", color: "#4f7cff", points: this.tps.map(([t, v]) => [t - t0, v]) }], { yMin: 0, xLabel: "s" });
      if (w.accepted + w.rejected !== this.lastJudged) { this.lastJudged = w.accepted + w.rejected; this.loadHistory(); }
    }

    updateValidator(v) {
      this.chips(this.reasons, v.rejected_by_reason, (k) => COLORS[k] || "#999");
      const counts = { accepted: v.accepted, ...v.rejected_by_reason };
      Charts.bars(this.verdictChart, Object.entries(counts).map(([k, n]) => ({ label: k, value: n, color: COLORS[k] || "#999" })), { empty: "no verdicts yet" });
      this.recent.replaceChildren(...v.recent.slice(-8).reverse().map((r) =>
        h("tr", {}, h("td", {}, h("code", {}, short(r.worker))), h("td", {}, h("code", {}, r.key)),
          h("td", { class: "verdict " + r.verdict }, r.verdict), h("td", {}, secs(r.latency_s)))));
      if (v.judged !== this.lastJudged) { this.lastJudged = v.judged; this.loadHistory(); }
    }

    updateTrainer(t) {
      const c = t.curve || [];
      Charts.line(this.curve, [
        { name: "reward", color: "#4f7cff", points: c.map((p) => [p.step, p.reward_mean]) },
        { name: "held-out, sampled", color: "#2e9e5b", points: c.map((p) => [p.step, p.heldout_sampled]) },
        { name: "held-out, greedy", color: "#a3c9b0", points: c.map((p) => [p.step, p.heldout_greedy]) }],
        { yMin: 0, yMax: 1, xPrefix: "step ", empty: "no step trained yet" });
      Charts.bars(this.batchChart, c.filter((p) => p.step > 0).slice(-60).map((p) => ({ label: String(p.step), value: p.batches_used || 0 })), { empty: "no step trained yet" });
    }

    async loadHistory() {
      if (!this.histChart || this.loading) return;
      this.loading = true;
      try {
        const r = await fetch(this.base + "/history", { cache: "no-store" });
        const hist = await r.json().catch(() => ({}));
        if (r.ok) this.updateHistory(hist);
        else this.histNote.textContent = "history unavailable: " + (hist.error || "HTTP " + r.status);
      } catch (e) {
        this.histNote.textContent = "history unavailable: " + e;
      } finally {
        this.loading = false;
      }
    }

    updateHistory(hist) {
      this.history = hist;
      if (!hist.available) {
        this.histNote.textContent = "history unavailable: " + (hist.reason || "no chain");
        return;
      }
      const count = {};
      for (const r of hist.rows) count[r.kind] = (count[r.kind] || 0) + 1;
      for (const k of ["submission", "verdict", "slash", "claim", "stake"]) count[k] = count[k] || 0;
      this.setFigures({ count }, "history.");
      this.histNote.textContent = `${hist.rows.length} events of ${hist.address} over ${hist.days.length} day(s), cumulative:`;
      const t0 = hist.rows.length ? hist.rows[0].time : 0;
      const cum = (kind) => { let n = 0; return hist.rows.filter((r) => r.kind === kind).map((r) => [(r.time - t0) / 60, ++n]); };
      Charts.line(this.histChart, [
        { name: "submissions", color: "#4f7cff", points: cum("submission") },
        { name: "verdicts", color: "#2e9e5b", points: cum("verdict") }],
        { yMin: 0, xLabel: "min", empty: "no events yet" });
      const short6 = (w) => (w ? String(Number((Number(w) / 1e18).toFixed(6))) : "0");
      this.histDays.replaceChildren(...hist.days.slice(-7).reverse().map((d) =>
        h("tr", {}, h("td", {}, d.day), ...["submitted", "accepted", "rejected", "judged"].map((k) => h("td", {}, int(d[k]))),
          ...["slashed_wei", "settled_reward_wei", "claimed_wei", "staked_wei"].map((k) => h("td", { title: "ETH" }, short6(d[k]))))));
      this.histRows.replaceChildren(...hist.rows.slice(-8).reverse().map((r) =>
        h("tr", {}, h("td", {}, String(r.block)), h("td", {}, r.event), h("td", {}, r.amount_wei ? eth(r.amount_wei) : ""), h("td", {}, r.detail))));
      const at = (x) => (x ? h("code", { title: x.tx }, `${x.block} ${x.tx.slice(0, 10)}`) : "–");
      this.lives.replaceChildren(...(hist.batches || []).slice(-10).reverse().map((b) =>
        h("tr", {}, h("td", {}, h("code", { title: b.key }, short(b.key))), h("td", {}, at(b.submitted)),
          h("td", {}, ...(b.verdicts.length ? b.verdicts.map((v) => h("div", {}, v.event.replace("Work", "").toLowerCase() + " ", at(v))) : ["–"])),
          h("td", {}, at(b.settled)), h("td", {}, at(b.claimed)))));
      const dis = hist.disagreements || [];
      this.disagree.replaceChildren(...(dis.length ? dis.map((d) => h("li", { class: "bad" }, d))
        : [h("li", { class: "muted" }, "they agree")]));
    }
  }

  async function readStatus(panel) {
    try {
      const r = await fetch(panel.base + "/status", { cache: "no-store" });
      if (r.ok) {
        const st = await r.json();
        panel.update(st);
        setState(panel, true);
        if (summary) summary.fill(panel.spec.name, st);
      } else setState(panel, false);
    } catch (e) { setState(panel, false); }
  }

  // The /events stream. A lost connection the browser opens again by itself; an answer
  // other than 200 (the node's 503 when it serves its maximum of streams) closes the stream
  // for good, so the page reads /status each second meanwhile and asks for the stream again,
  // later each time.
  function follow(panel) {
    let delay = RETRY_MS, polling = null;
    const open = () => {
      const es = new EventSource(panel.base + "/events");
      es.addEventListener("status", (e) => {
        delay = RETRY_MS;
        if (polling) { clearInterval(polling); polling = null; }
        panel.update(JSON.parse(e.data));
        setState(panel, true);
      });
      es.onerror = () => {
        if (es.readyState !== EventSource.CLOSED) { setState(panel, false); return; }
        if (!polling) { readStatus(panel); polling = setInterval(() => readStatus(panel), POLL_MS); }
        setTimeout(open, delay);
        delay = Math.min(delay * 2, RETRY_MAX_MS);
      };
    };
    open();
  }

  function live(panel, mode) {
    const poll = async () => { await readStatus(panel); setTimeout(poll, POLL_MS); };
    if (mode === "events" && window.EventSource) follow(panel); else poll();
    setInterval(() => silence(panel), 1000);
    panel.loadHistory();
    setInterval(() => panel.loadHistory(), HISTORY_MS);
  }

  function setState(panel, ok) {
    panel.el.classList.toggle("offline", !ok);
    if (summary && !ok && panel.status) summary.fill(panel.spec.name, panel.status, false);
    if (ok) { panel.heard = Date.now(); panel.notice.hidden = true; }
    document.body.setAttribute("data-updated", String(Date.now()));
  }

  // nothing heard for SILENT_MS: say so plainly (a node restarted without a fixed
  // [admin] port listens on another port, which this page cannot know)
  function silence(panel) {
    const quiet = Date.now() - panel.heard;
    if (quiet < SILENT_MS) return;
    panel.el.classList.add("offline");
    panel.notice.hidden = false;
    const name = panel.spec.name || "this node";
    panel.notice.textContent = `No answer from ${name} for ${Math.round(quiet / 1000)} s: ` + (panel.base
      ? "the node (or the devnet) has stopped; this page follows the node again once it runs."
      : "the node has stopped, or it restarted and listens on another port. Once it runs, " +
        "run `intellect-node dashboard` again for its address.");
  }

  async function main() {
    const root = document.getElementById("nodes");
    let spec = { nodes: [{ name: "", base: "" }], live: "poll" };
    try {
      const r = await fetch("nodes.json", { cache: "no-store" });
      if (r.ok) spec = await r.json();
    } catch (e) { /* served without nodes.json: this node alone, polled */ }
    document.getElementById("title").textContent = spec.title || "intellect-node";
    root.classList.toggle("many", spec.nodes.length > 1);
    if (spec.nodes.length > 1) summary = new Summary(document.getElementById("summary"), spec.nodes);
    for (const n of spec.nodes) live(new NodePanel(root, n), spec.live);
  }
  main();
})();
