"""The live inventory: the node's devices followed while serve runs, without a restart.

`effective` decides (pure) what is published after a scan; `watcher` decides when to scan
(a kick: NVML's MIG events, a changed fake profile file, an unprepare; or a periodic rescan) and
hands changes on.
"""

from dradriver.inventory.effective import LiveDevices, effective_devices
from dradriver.inventory.watcher import InventoryWatcher

__all__ = ["InventoryWatcher", "LiveDevices", "effective_devices"]
