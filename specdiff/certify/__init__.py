"""`specdiff certify`: one battery that checks a deployment's claim that greedy decoding
repeats, property by property, and writes a certificate with the evidence for each.

`records` holds the verdict logic and the certificate record (pure: token steps in,
verdicts out); `evidence` reads what servers say of themselves (/metrics, /slots) into
numbers; `battery` runs each property's requests on a side (`sides`): the in-process
engine (`local_side`) or a server (`server_side`).
"""
