"""KIP-932's share coordinator: the state of share partitions (`share_partition`: the
in-flight records' states, delivery counts and acquisition locks of one group on one
partition) and its durable form in `__share_group_state` (`state_store`)."""
