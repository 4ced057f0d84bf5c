"""KRaft's quorum (KIP-595 with KIP-996 pre-vote, KIP-630 snapshots, KIP-853 dynamic voters).

`core.RaftCore` is sans-I/O: it takes requests, responses, disk completions and the time, and
returns effects (messages to send, log writes, state to persist, commits to apply). The drivers
(`file_log`, `driver`) do the I/O around it.
"""
