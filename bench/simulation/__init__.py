"""A discrete-event simulator of an intellect-node network that drives the project's own
decision code, on simulated links and a simulated clock (no sockets, no sleeps).

- ``events.py``: the event loop (a heap of timed callbacks).
- ``links.py``: per-node links (up/down rate, access RTT, region, NAT) and the link
  distributions the predictions use, each with its source.
- ``swarm.py``: SHARDCAST: every downloader runs the real ``DownloadPlan``
  (``node/shardcast/schedule.py``); uploads get the node's upload slots and their FIFO
  wait; a piece moves at the fair share of the sender's uplink and the receiver's downlink;
  downloaders may leave and come back (``SwarmConfig.churn``).
- ``judging.py``: the validators: each runs the real ``JudgingQueue``
  (``node/roles/decisions/judging.py``) fed by workers' batches, fetches over the links,
  judgements at a measured cost, votes in chain blocks.
- ``baselines.py``: a single HTTP origin and a relay tree (SHARDCAST's first design).
- ``gossip.py``: announcement delivery over a gossipsub mesh: every copy a node sends or
  receives costs its process time, one job after another, on cores the nodes may share.
- ``derived.py``: announcement delivery at scale (``gossip.py``), DHT lookup hops, and the
  figures derived from measured costs (async level, validators, chain transactions).
- ``gossipcheck.py``: the gossip model against real node processes on 127.0.0.1.

``bench/sim.py`` runs it against the real swarm bench and at scale; ``docs/simulation.md``
states the model, its assumptions and what it does not model.
"""
