"""Remote execution: one seam, ``Runner.run(argv, timeout) -> CommandResult``.

``runner`` holds the protocol, the result value and the bounded parallel fan-out; ``ssh`` is the
paramiko adapter, ``local`` runs on this machine, ``fake`` replays scripted results for tests of
the workflows.
"""
