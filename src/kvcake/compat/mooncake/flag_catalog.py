"""The flags of Mooncake 0.3.13's programs, as its ``mooncake_master --help`` and
``mooncake_client --help`` list them (name, gflags type, default; taken from the wheel's
``--help`` output on 2026-12-06): the stand-ins (:mod:`.programs`) accept exactly these.
What kvcake does with each is in :mod:`.master_flags` and :mod:`.real_client_flags`."""

from __future__ import annotations

from kvcake.compat.mooncake.gflags import GFlag, table

# mooncake-store/src/master.cpp and utils.cpp
MASTER = """
allocation_strategy string random
allow_evict_soft_pinned_objects bool true
batch_oplog_retry_timeout_sec uint32 180
client_ttl int64 10
cluster_id string mooncake_cluster
config_path string ''
cxl_path string /dev/dax0.0
cxl_size uint64 8589934592
default_kv_lease_ttl string 10000
default_kv_soft_pin_ttl string 1800000
dynamic_replication_admission_qps_threshold double 0.8
dynamic_replication_heat_window_seconds uint32 10
dynamic_replication_max_memory_replicas uint64 2
dynamic_replication_mode string off
enable_cxl bool false
enable_disk_eviction bool true
enable_ha bool false
enable_http_metadata_server bool false
enable_kv_events bool false
enable_metadata_cleanup_on_timeout bool false
enable_metric_reporting bool true
enable_multi_tenants bool false
enable_offload bool false
enable_oplog bool false
enable_snapshot bool false
enable_snapshot_restore bool false
etcd_endpoints string ''
eviction_high_watermark_ratio double 0.9
eviction_ratio double 0.05
global_file_segment_size int64 9223372036854775807
ha_backend_connstring string ''
ha_backend_type string etcd
http_metadata_server_host string 0.0.0.0
http_metadata_server_port int32 8080
kv_events_additional_salt string ''
kv_events_backend_id string ''
kv_events_bind_endpoint string ''
kv_events_block_size uint32 0
kv_events_dp_rank uint32 0
kv_events_emit_legacy_compat bool true
kv_events_emit_object_key bool true
kv_events_lora_name string ''
kv_events_model_name string ''
kv_events_queue_capacity uint32 65536
kv_events_tenant_id string default
max_kv_soft_pin_ttl string 86400000
max_retry_attempts uint32 10
max_threads int32 16
max_total_finished_tasks uint32 10000
max_total_pending_tasks uint32 10000
max_total_processing_tasks uint32 10000
memory_allocator string offset
metrics_host string 0.0.0.0
metrics_port int32 9003
nof_eviction_high_watermark_ratio double 0.9
nof_eviction_ratio double 0.05
nof_heartbeat_failures_threshold uint32 3
nof_heartbeat_interval_sec int64 10
nof_heartbeat_probe_timeout_ms uint32 1000
offload_cap_ratio double 0.5
offload_force_evict bool false
offload_on_evict bool false
offloading_queue_limit uint64 50000
oplog_batch_max_entries uint32 1024
oplog_poll_interval_ms int32 1000
pending_task_timeout_sec uint64 300
pod_name string ''
pod_namespace string ''
port int32 50051
processing_task_timeout_sec uint64 300
promotion_admission_threshold uint32 2
promotion_max_per_heartbeat uint32 1
promotion_on_hit bool false
promotion_queue_limit uint32 50000
put_start_discard_timeout_sec uint64 30
put_start_release_timeout_sec uint64 600
quota_bytes uint64 0
root_fs_dir string ''
rpc_address string 0.0.0.0
rpc_conn_timeout_seconds int32 0
rpc_enable_tcp_no_delay bool true
rpc_interface string ''
rpc_port int32 0
rpc_thread_num int32 0
snapshot_backup_dir string ''
snapshot_catalog_backend_connstring string ''
snapshot_catalog_backend_type string ''
snapshot_catalog_store_connstring string ''
snapshot_catalog_store_type string ''
snapshot_child_timeout_seconds uint64 300
snapshot_interval_seconds uint64 600
snapshot_object_store_type string ''
snapshot_payload_backend_type string ''
snapshot_payload_store_type string ''
snapshot_retention_count uint32 2
tenant_quota_connector_type string file
tenant_quota_connector_uri string ''
mmap_arena_pool_size uint64 8589934592
use_mmap_arena_allocator bool false
"""

# mooncake-store/src/real_client.cpp, real_client_main.cpp and utils.cpp
CLIENT = """
enable_http_server bool false
http_port int32 9300
device_names string ''
enable_offload bool false
global_segment_size string 4 GB
host string 0.0.0.0
local_buffer_size string 0
master_server_address string 127.0.0.1:50051
metadata_server string http://127.0.0.1:8080/metadata
port int32 50052
protocol string tcp
start_offload_rpc_server bool true
tenant_id string default
threads int32 1
mmap_arena_pool_size uint64 8589934592
use_mmap_arena_allocator bool false
"""

# gflags 2.1.2's own flags and glog's, in every Mooncake program
COMMON = """
flagfile string ''
fromenv string ''
tryfromenv string ''
undefok string ''
tab_completion_columns int32 80
tab_completion_word string ''
help bool false
helpfull bool false
helpmatch string ''
helpon string ''
helppackage bool false
helpshort bool false
helpxml bool false
version bool false
alsologtoemail string ''
alsologtostderr bool false
colorlogtostderr bool false
drop_log_memory bool true
log_backtrace_at string ''
log_dir string ''
log_link string ''
log_prefix bool true
logbuflevel int32 0
logbufsecs int32 30
logemaillevel int32 999
logfile_mode int32 436
logmailer string /bin/mail
logtostderr bool false
max_log_size int32 1800
minloglevel int32 0
stderrthreshold int32 2
stop_logging_if_full_disk bool false
symbolize_stacktrace bool true
v int32 0
vmodule string ''
"""

GLOG_NOTE = "glog: kvcake logs to stderr; accepted"
GFLAGS_NOTE = "gflags"
LOG_LEVEL = {"minloglevel", "v", "stderrthreshold"}  # these set kvcake's log level


def common() -> dict[str, GFlag]:
    flags = table(COMMON, GLOG_NOTE)
    for name in ("flagfile", "fromenv", "tryfromenv", "undefok", "help", "helpfull",
                 "helpshort", "helpmatch", "helpon", "helppackage", "helpxml", "version",
                 "tab_completion_columns", "tab_completion_word"):  # fmt: skip
        flags[name] = GFlag(name, flags[name].kind, flags[name].default, GFLAGS_NOTE)
    for name in LOG_LEVEL:
        f = flags[name]
        flags[name] = GFlag(name, f.kind, f.default, "glog: sets kvcake's log level")
    return flags
