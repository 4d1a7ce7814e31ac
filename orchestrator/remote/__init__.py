"""Remote execution: one seam, ``Runner.run(argv, timeout) -> CommandResult``.

``runner`` holds the protocol, the result value and the bounded parallel fan-out; ``ssh`` is the
paramiko adapter, ``local`` runs on this machine, ``fake`` replays scripted results for tests of
the workflows; ``known_hosts`` verifies and records host keys; ``connect`` picks and opens the
runner of each node of a manifest; ``banner`` says what a port that is not sshd's answered.
``node_programs`` holds the code that runs on the nodes and the one way it is shipped there.

This ``__init__`` imports nothing: a module of the package that imports a sibling goes through it,
so anything imported here would be an import cycle (ssh -> remote -> ssh).
"""
