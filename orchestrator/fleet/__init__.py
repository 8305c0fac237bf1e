"""The fleet: inventories, SSH transport and fan-out, node facts, privileged preparation,
provisioning (wheels, weights, the agent) and where things live on a node."""
