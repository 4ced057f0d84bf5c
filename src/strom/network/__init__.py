"""The network layer: listeners, connections and the order of requests on them (Kafka's
SocketServer), and the client and connection quotas it enforces. It hands each request to the
handlers it is given and knows nothing of what they do."""
