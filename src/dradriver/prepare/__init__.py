"""Preparing ResourceClaims on the node: allocation handling, opaque config, CDI specs, checkpoint.

One claim, one transaction. The kubelet sends one pod's claims per call and the driver runs one
call at a time (`GpuDriver._exclusive`: an in-process lock, and `serialize.lock` across the
instances of a rolling update), as the upstream helper does by default. Each claim goes reserve
→ MIG devices → GPU shares → sharing settings → CDI spec → checkpoint; when the call's checkpoint
write fails, what that call set up is undone, and nothing else.

A claim's walk from the gRPC call to its CDI file: 8 hops over 4 files, the frames on the stack
when the file is written (`python -m bench.claim_walk` counts them):
1. `_DRAPluginAdapter.NodePrepareResources` → `_prepare` → `_call` (plugin/dra.py): the request
   as `ClaimRef`s, the call's log line and metrics once it has ended;
2. `DRAService.prepare` (plugin/dra.py): waits for the node to be built, keeps the kubelet's
   contract (one answer per claim UID, base request names);
3. `GpuDriver.prepare` (gpu_driver.py): checks each reference, fetches the claims
   (`ClaimFetcher`, fetch.py) before the lock, then takes it;
4. `Preparer.run` → `_prepare` (preparer.py): plans each claim (`plan_claim`, plan.py), frees
   devices stale holders keep (`StaleHolders`, stale.py), reserves (`Ledger.reserve`,
   ledger.py), runs the claim's steps and renders its spec (cdi.py);
5. `Preparer._write_specs` → `CdiDirectory.write_many` (cdi.py): the CDI file; then
   `Ledger.complete` and `Ledger.persist` record it before the call answers.

The modules, by what they hold:
- gpu_driver: the facade the gRPC layer calls; ledger: the prepared state and its checkpoint
  (the only reader and writer of it); preparer / unprepare: the two pipelines; recovery:
  start-up; stale: claims that no longer need their devices; release: undoing one claim;
- plan, config, resourceclaim, claims, fetch: the claim and its opaque config, as fetched;
- cdi, edits, devnodes, hostdriver: what a spec holds and where it is written;
- metadata / metadata_files: the device metadata a claim's containers read (KEP-5304), and its
  files;
- mig: MIG devices made for claims;
- sharing_settings: a claim's own sharing config (TimeSlicing, MPS per claim);
  gpu_shares / gpu_share_daemons: consumable-capacity shares of a GPU and their per-GPU daemons;
- serialize: the lock across instances during a rolling update.
"""
