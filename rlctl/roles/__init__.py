"""The role processes, each started as `python -m rlctl.roles.<role>`.

Importing the package is the first thing each of them does: it tethers a process the supervisor started to that
supervisor before torch and the rest are imported (rlctl.tether).
"""

from rlctl.tether import tether_to_supervisor

tether_to_supervisor()
