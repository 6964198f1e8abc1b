"""Job coordination over the etcd seam: which replica owns which job (leases,
rendezvous placement) and which jobs are registered, ended or dormant."""
