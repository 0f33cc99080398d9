"""The roles' decisions: small classes and functions with no network, no chain and no
clock of their own (they are given the time), each tested on its own: which version to
use and how many batches may wait for a verdict (``working``), which batch to fetch next
and when to give up (``judging``), what a trainer may train on (``workbook``), which
member of a DiLoCo group trains on a batch (``grouping``), the step clock and its async
window (``clock``); and the words they share: ``work`` (``Key``, ``Verdict``, the chain's
records of them), ``status`` (the roles' ``/status`` sections), ``busy`` (the idle share).
A few keep their own state file (``workbook``, ``grouping``), written atomically."""
