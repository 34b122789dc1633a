"""What the head, the wire and the stages all speak of: sampling settings, sparse distributions, and a
stage's readout of its logits (top-1 ids or distributions). Nothing here imports the wire, the runtime
or the head, so each of them can use it."""
