"""The roles a node plays, each a service the runtime starts: ``inference`` generates and
submits rollout batches, ``validator`` judges them, ``trainer`` turns accepted batches
into new policies. The decisions each role makes live in small pure classes beside it."""
