"""The user's commands on the batch node and what they leave running: up, ps, exec and down
(control), checkpoint, migrate, the keeper and the holder."""
