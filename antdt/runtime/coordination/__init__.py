"""Job coordination over the etcd seam: which replica owns which job (leases,
rendezvous placement) and which jobs are registered, ended or dormant; and, over the
bus, the incidents a job's previous owner left open (`leftopen`), which the monitor and
the controller taking a job over both carry on."""
