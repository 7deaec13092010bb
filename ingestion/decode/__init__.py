"""Events a wallet can use: contract events' ScVals decoded to SEP-51 XDR-JSON, one transfer view
across Soroban token events and Horizon payments, and watch lists that keep only the records naming
watched addresses. Pure rules (``scval``, ``transfers``, ``payments``, ``watch``) and the stage that
applies them to a job's batches (``stage``)."""
