"""Security: TLS contexts and certificate principals, SASL (PLAIN, SCRAM, OAUTHBEARER, and how
brokers authenticate to each other), the ACL authorizer and delegation tokens."""
