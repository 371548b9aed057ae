"""A store master that survives: its metadata in an operation log (etcd or a local directory),
compacted by snapshots, replayed by a new leader or a restarted master. See docs/store.md,
"High availability and persistence".

Modules: ``view`` (records, the durable view) · ``oplog`` (the log ABC, group commit) ·
``filelog`` / ``etcdlog`` (backends) · ``journal`` (a MasterState that notes its changes) ·
``replay`` (state from a view) · ``durable`` (the master that waits for the log) ·
``election`` / ``node`` (leader election, the HA master process) · ``resolve`` (clients find
the leader through ``etcd://``) · ``etcd`` (the JSON-gateway client).
"""
