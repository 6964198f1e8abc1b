# The AntDT control plane on Nomad: two replicas of each service, on distinct hosts,
# rolled one allocation at a time.
#
#   docker build -f deploy/Dockerfile -t antdt:0.1.0 .   # push it where your clients pull
#   nomad job run -var nats_url=nats://nats.service.consul:4222 \
#                 -var etcd_endpoint=etcd.service.consul:2379 deploy/antdt.nomad.hcl
#
# NATS (with JetStream, `-js`, and deploy/nats.conf's max_pending, max_payload) and etcd (with the
# auto-compaction that deploy/compose.yaml sets: every ledger write stays in etcd's
# history until compacted) are yours to run; this job only points at them.
#
# Authentication and TLS (docs/architecture.md, "Security and deployment"): each service
# logs in to NATS and etcd as its own user, its password read from the Nomad variable
# nomad/jobs/antdt/<service> (key `password`), and shows a client certificate from
# nomad/jobs/antdt/tls (keys `ca`, `cert`, `key`, PEM); both rendered into the task's
# secrets/ directory:
#   nomad var put nomad/jobs/antdt/monitor password=...   (and controller, shards)
#   nomad var put nomad/jobs/antdt/tls ca=@ca.pem cert=@client.pem key=@client.key
# NATS users come from python -m antdt.runtime.servers.natsconf; etcd's users, as
# deploy/compose.yaml's etcd-users service makes them. Streams are replicated
# `stream_replicas` times (3: a three-node JetStream cluster).
#
# Replicas need nothing of each other: the monitor and controller spread jobs over their
# live replicas (etcd `members/{service}/`), shards replicas share one NATS queue group,
# and a replica that dies has its jobs taken over within its lease's TTL (5 s). SIGTERM
# starts a staged shutdown (drain subscriptions, finish in-flight work, revoke the lease,
# flush telemetry), which kill_timeout leaves time for. Settings: `ANTDT_*` variables,
# each a field of the service's settings (`antdt <service> --help`, docs/architecture.md);
# tests/unit/test_deploy.py checks that every one named here is.

variable "image" {
  type        = string
  default     = "antdt:0.1.0"
  description = "The control-plane image (deploy/Dockerfile; its entrypoint is `antdt`)"
}

variable "nats_url" {
  type        = string
  default     = "nats://nats.service.consul:4222"
  description = "NATS server URL(s), comma-separated"
}

variable "etcd_endpoint" {
  type        = string
  default     = "etcd.service.consul:2379"
  description = "etcd client endpoint, host:port"
}

variable "otlp_endpoint" {
  type        = string
  default     = "null"
  description = "OTLP endpoint for spans (grpc host:port, e.g. Jaeger's 4317); null: none"
}

variable "stream_replicas" {
  type        = number
  default     = 3
  description = "Replication factor of AntDT's JetStream streams (1 on a single server)"
}

variable "replicas" {
  type        = number
  default     = 2
  description = "Replicas of each service"
}

variable "datacenters" {
  type    = list(string)
  default = ["dc1"]
}

job "antdt" {
  type        = "service"
  datacenters = var.datacenters

  update {
    max_parallel     = 1 # one replica at a time: the others take its jobs over meanwhile
    health_check     = "checks"
    min_healthy_time = "15s"
    healthy_deadline = "3m"
    auto_revert      = true
  }

  group "monitor" {
    count = var.replicas

    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    network {
      port "metrics" {
        to = 9464
      }
    }

    service {
      name     = "antdt-monitor"
      port     = "metrics"
      provider = "nomad"
      tags     = ["prometheus"]

      check {
        type     = "http"
        path     = "/readyz"
        interval = "10s"
        timeout  = "2s"
      }
    }

    restart {
      attempts = 10
      interval = "5m"
      delay    = "5s"
      mode     = "delay"
    }

    task "monitor" {
      driver       = "docker"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      config {
        image = var.image
        args  = ["monitor"]
        ports = ["metrics"]
      }

      template { # the password of its NATS and etcd users, as environment variables
        destination = "${NOMAD_SECRETS_DIR}/users.env"
        env         = true
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/antdt/monitor" }}
        ANTDT_NATS__PASSWORD={{ .password }}
        ANTDT_ETCD__PASSWORD={{ .password }}
        {{ end }}
        EOT
      }

      dynamic "template" { # the CA and the client certificate and key, as files
        for_each = { "ca.pem" = "ca", "client.pem" = "cert", "client.key" = "key" }
        content {
          destination = "${NOMAD_SECRETS_DIR}/${template.key}"
          perms       = "0400"
          data        = "{{ with nomadVar \"nomad/jobs/antdt/tls\" }}{{ index . \"${template.value}\" }}{{ end }}"
        }
      }

      env {
        ANTDT_NATS__URL                = var.nats_url
        ANTDT_ETCD__ENDPOINT           = var.etcd_endpoint
        ANTDT_REPLICA_ID               = "monitor-${NOMAD_ALLOC_ID}"
        ANTDT_NATS__STREAM_REPLICAS    = var.stream_replicas
        ANTDT_NATS__USER               = "monitor"
        ANTDT_ETCD__USER               = "monitor"
        ANTDT_NATS__TLS__CA            = "${NOMAD_SECRETS_DIR}/ca.pem"
        ANTDT_NATS__TLS__CERT          = "${NOMAD_SECRETS_DIR}/client.pem"
        ANTDT_NATS__TLS__KEY           = "${NOMAD_SECRETS_DIR}/client.key"
        ANTDT_ETCD__TLS__CA            = "${NOMAD_SECRETS_DIR}/ca.pem"
        ANTDT_ETCD__TLS__CERT          = "${NOMAD_SECRETS_DIR}/client.pem"
        ANTDT_ETCD__TLS__KEY           = "${NOMAD_SECRETS_DIR}/client.key"
        ANTDT_TELEMETRY__OTLP_ENDPOINT = var.otlp_endpoint
        ANTDT_TELEMETRY__METRICS_PORT  = "9464"
        ANTDT_TELEMETRY__LOG_FORMAT    = "json"
        # A job none of whose ranks is heard from this long (seconds) is ended as
        # abandoned; it stays dormant (a step revives it).
        ANTDT_ABANDON_AFTER_S = "3600"
        # Step events a replica may hold while behind, all its jobs together (bytes):
        # keep it well under the task's memory.
        ANTDT_STEP_BACKLOG_BYTES = "268435456"
      }

      resources {
        cpu    = 2000
        memory = 1024
      }
    }
  }

  group "controller" {
    count = var.replicas

    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    network {
      port "metrics" {
        to = 9464
      }
    }

    service {
      name     = "antdt-controller"
      port     = "metrics"
      provider = "nomad"
      tags     = ["prometheus"]

      check {
        type     = "http"
        path     = "/readyz"
        interval = "10s"
        timeout  = "2s"
      }
    }

    restart {
      attempts = 10
      interval = "5m"
      delay    = "5s"
      mode     = "delay"
    }

    task "controller" {
      driver       = "docker"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      config {
        image = var.image
        args  = ["controller"]
        ports = ["metrics"]
      }

      template { # the password of its NATS and etcd users, as environment variables
        destination = "${NOMAD_SECRETS_DIR}/users.env"
        env         = true
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/antdt/controller" }}
        ANTDT_NATS__PASSWORD={{ .password }}
        ANTDT_ETCD__PASSWORD={{ .password }}
        {{ end }}
        EOT
      }

      dynamic "template" { # the CA and the client certificate and key, as files
        for_each = { "ca.pem" = "ca", "client.pem" = "cert", "client.key" = "key" }
        content {
          destination = "${NOMAD_SECRETS_DIR}/${template.key}"
          perms       = "0400"
          data        = "{{ with nomadVar \"nomad/jobs/antdt/tls\" }}{{ index . \"${template.value}\" }}{{ end }}"
        }
      }

      env {
        ANTDT_NATS__URL                = var.nats_url
        ANTDT_ETCD__ENDPOINT           = var.etcd_endpoint
        ANTDT_REPLICA_ID               = "controller-${NOMAD_ALLOC_ID}"
        ANTDT_NATS__STREAM_REPLICAS    = var.stream_replicas
        ANTDT_NATS__USER               = "controller"
        ANTDT_ETCD__USER               = "controller"
        ANTDT_NATS__TLS__CA            = "${NOMAD_SECRETS_DIR}/ca.pem"
        ANTDT_NATS__TLS__CERT          = "${NOMAD_SECRETS_DIR}/client.pem"
        ANTDT_NATS__TLS__KEY           = "${NOMAD_SECRETS_DIR}/client.key"
        ANTDT_ETCD__TLS__CA            = "${NOMAD_SECRETS_DIR}/ca.pem"
        ANTDT_ETCD__TLS__CERT          = "${NOMAD_SECRETS_DIR}/client.pem"
        ANTDT_ETCD__TLS__KEY           = "${NOMAD_SECRETS_DIR}/client.key"
        ANTDT_TELEMETRY__OTLP_ENDPOINT = var.otlp_endpoint
        ANTDT_TELEMETRY__METRICS_PORT  = "9464"
        ANTDT_TELEMETRY__LOG_FORMAT    = "json"
        # Ended jobs' keys are deleted this long after the end (seconds; 0 keeps them).
        ANTDT_JOB_RETENTION_S = "604800"
      }

      resources {
        cpu    = 1000
        memory = 512
      }
    }
  }

  group "shards" {
    count = var.replicas

    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    network {
      port "metrics" {
        to = 9464
      }
    }

    service {
      name     = "antdt-shards"
      port     = "metrics"
      provider = "nomad"
      tags     = ["prometheus"]

      check {
        type     = "http"
        path     = "/readyz"
        interval = "10s"
        timeout  = "2s"
      }
    }

    restart {
      attempts = 10
      interval = "5m"
      delay    = "5s"
      mode     = "delay"
    }

    task "shards" {
      driver       = "docker"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      config {
        image = var.image
        args  = ["shards"]
        ports = ["metrics"]
      }

      template { # the password of its NATS and etcd users, as environment variables
        destination = "${NOMAD_SECRETS_DIR}/users.env"
        env         = true
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/antdt/shards" }}
        ANTDT_NATS__PASSWORD={{ .password }}
        ANTDT_ETCD__PASSWORD={{ .password }}
        {{ end }}
        EOT
      }

      dynamic "template" { # the CA and the client certificate and key, as files
        for_each = { "ca.pem" = "ca", "client.pem" = "cert", "client.key" = "key" }
        content {
          destination = "${NOMAD_SECRETS_DIR}/${template.key}"
          perms       = "0400"
          data        = "{{ with nomadVar \"nomad/jobs/antdt/tls\" }}{{ index . \"${template.value}\" }}{{ end }}"
        }
      }

      env {
        ANTDT_NATS__URL                = var.nats_url
        ANTDT_ETCD__ENDPOINT           = var.etcd_endpoint
        ANTDT_REPLICA_ID               = "shards-${NOMAD_ALLOC_ID}"
        ANTDT_NATS__STREAM_REPLICAS    = var.stream_replicas
        ANTDT_NATS__USER               = "shards"
        ANTDT_ETCD__USER               = "shards"
        ANTDT_NATS__TLS__CA            = "${NOMAD_SECRETS_DIR}/ca.pem"
        ANTDT_NATS__TLS__CERT          = "${NOMAD_SECRETS_DIR}/client.pem"
        ANTDT_NATS__TLS__KEY           = "${NOMAD_SECRETS_DIR}/client.key"
        ANTDT_ETCD__TLS__CA            = "${NOMAD_SECRETS_DIR}/ca.pem"
        ANTDT_ETCD__TLS__CERT          = "${NOMAD_SECRETS_DIR}/client.pem"
        ANTDT_ETCD__TLS__KEY           = "${NOMAD_SECRETS_DIR}/client.key"
        ANTDT_TELEMETRY__OTLP_ENDPOINT = var.otlp_endpoint
        ANTDT_TELEMETRY__METRICS_PORT  = "9464"
        ANTDT_TELEMETRY__LOG_FORMAT    = "json"
        # Bytes a second one job's ledger writes into etcd's history, on average.
        ANTDT_LEDGER_WRITE_BYTES_PER_S = "1048576"
        # Keep under etcd's --max-request-bytes (1.5 MiB by default), raised together.
        ANTDT_MAX_TXN_BYTES = "1500000"
      }

      resources {
        cpu    = 2000
        memory = 1024
      }
    }
  }
}
