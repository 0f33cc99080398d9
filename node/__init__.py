"""The intellect-node binary: CLI, config, libp2p runtime and the roles."""
