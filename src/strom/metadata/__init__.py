"""What this broker knows of the cluster: the metadata cache the controller's UpdateMetadata
requests keep (live brokers and their endpoints, topics, partition leaders and ISRs)."""
