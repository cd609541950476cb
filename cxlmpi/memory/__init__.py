"""Where pools live: the backends behind CXLMPI_POOL (`backends`), the
partition table of a shared file or device (`partitions`) and its lock
(`table_lock`), who lives among the processes that share it (`liveness`),
who may use pool memory (`access`), whether it gets huge pages (`pages`)."""
