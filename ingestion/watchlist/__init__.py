"""Watch lists: the accounts and contracts a job keeps records of (``lists``), their strkey rules
(``addresses``), and the operator's edits to a list kept in Redis (``edits``)."""
