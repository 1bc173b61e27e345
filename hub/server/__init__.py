"""The process around HubState: the ROUTER loop with its deferred and parked replies, delta and wait operations, load accounting, batched plan replies, the journal."""
