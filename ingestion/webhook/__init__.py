"""Push delivery: webhook jobs that POST another job's committed records to an endpoint, signed
(Standard Webhooks), in order, with the delivery position committed under the job's fencing token
(docs/WEBHOOKS.md)."""
