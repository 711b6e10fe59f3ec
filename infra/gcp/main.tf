# labkeep's session functions on Google Cloud Functions (2nd gen), one
# environment per Terraform workspace or state:
#
#   infra/gcp/stage.sh          # the buildpack's source layout, build/source
#   terraform -chdir=infra/gcp apply -var project=… -var env=dev -var gke_cluster=…
#
# test/infra/deploytemplates_test.go parses this file (hashicorp/hcl) and
# checks the entry point, runtime, schedule and LABKEEP_* environment
# against functions/gcf and functions/app.Config.

terraform {
  required_version = ">= 1.5"
  required_providers {
    google  = { source = "hashicorp/google", version = ">= 6.0" }
    archive = { source = "hashicorp/archive", version = ">= 2.4" }
  }
}

variable "project" {
  type        = string
  description = "Google Cloud project of the function, its secrets and the GKE cluster"
}

variable "region" {
  type    = string
  default = "europe-west1"
}

variable "env" {
  type        = string
  description = "LABKEEP_ENV, the environment (labels every object; scopes the locks)"
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,20}$", var.env))
    error_message = "env must be a short lowercase name such as dev, staging or prod."
  }
}

variable "gke_cluster" {
  type        = string
  description = "the GKE cluster the sessions run in"
}

variable "gke_location" {
  type        = string
  description = "the GKE cluster's region or zone"
  default     = "europe-west1"
}

variable "runtime" {
  type        = string
  description = "Cloud Functions Go runtime; matches go.mod's go line (test/infra checks it)"
  default     = "go126"
}

variable "source_dir" {
  type        = string
  description = "what infra/gcp/stage.sh wrote"
  default     = "build/source"
}

variable "jwt_audience" {
  type        = string
  description = "LABKEEP_JWT_AUDIENCE, the aud every portal token must carry (required, so a token minted for another service is refused)"
  validation {
    condition     = length(var.jwt_audience) > 0
    error_message = "jwt_audience is required: the aud the portal's tokens carry."
  }
}

variable "jwt_issuer" {
  type        = string
  description = "LABKEEP_JWT_ISSUER, the iss every portal token must carry (required)"
  validation {
    condition     = length(var.jwt_issuer) > 0
    error_message = "jwt_issuer is required: the iss the portal's tokens carry."
  }
}

variable "max_concurrent_vms" {
  type        = number
  description = "LABKEEP_MAX_CONCURRENT_VMS; keep it equal to the labkeep-vms quota"
  default     = 8
}

variable "max_concurrent_pods" {
  type        = number
  description = "LABKEEP_MAX_CONCURRENT_PODS; keep it equal to the labkeep-workspaces quota"
  default     = 20
}

variable "max_instances" {
  type        = number
  description = "most instances at once; each holds LABKEEP_DB_MAX_CONNS + LABKEEP_REAP_DB_CONNS connections"
  default     = 20
}

variable "vpc_connector" {
  type        = string
  description = "Serverless VPC Access connector reaching PostgreSQL and a private GKE endpoint (\"\": none)"
  default     = ""
}

variable "alert_notification_channels" {
  type        = list(string)
  description = "Cloud Monitoring notification channels of the alert policies"
  default     = []
}

locals {
  name = "labkeep-${var.env}"
  # The credentials, created and filled by the operator
  # (infra/README.md); the function reads their latest versions. The
  # function is public, so /metrics answers only the metrics token.
  secrets = {
    LABKEEP_DATABASE_URL    = "labkeep-database-url-${var.env}"
    LABKEEP_JWT_SECRET      = "labkeep-jwt-secret-${var.env}"
    LABKEEP_WORKSPACE_KEY   = "labkeep-workspace-key-${var.env}"
    LABKEEP_SCHEDULER_TOKEN = "labkeep-scheduler-token-${var.env}"
    LABKEEP_METRICS_TOKEN   = "labkeep-metrics-token-${var.env}"
  }
}

provider "google" {
  project = var.project
  region  = var.region
}

# The function's identity. In Google Cloud it may read its own secrets and
# pass GKE's IAM gate (labkeep_cluster_connect); in the cluster it may
# only impersonate the labkeep-functions ServiceAccount (rbac.yaml).
resource "google_service_account" "functions" {
  account_id   = "labkeep-functions-${var.env}"
  display_name = "labkeep session functions (${var.env})"
}

resource "google_service_account" "scheduler" {
  account_id   = "labkeep-scheduler-${var.env}"
  display_name = "labkeep reapTick schedule (${var.env})"
}

# container.clusters.get only: what GKE requires of a Google identity
# before Kubernetes RBAC decides. roles/container.developer would grant
# every namespace's objects through IAM, beside and above RBAC.
resource "google_project_iam_custom_role" "cluster_connect" {
  role_id     = "labkeepClusterConnect_${replace(var.env, "-", "_")}"
  title       = "labkeep: connect to GKE (${var.env})"
  permissions = ["container.clusters.get"]
}

resource "google_project_iam_member" "functions_cluster_connect" {
  project = var.project
  role    = google_project_iam_custom_role.cluster_connect.id
  member  = "serviceAccount:${google_service_account.functions.email}"
}

data "google_secret_manager_secret" "setting" {
  for_each  = local.secrets
  secret_id = each.value
}

resource "google_secret_manager_secret_iam_member" "functions_read" {
  for_each  = local.secrets
  secret_id = data.google_secret_manager_secret.setting[each.key].id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.functions.email}"
}

# The scheduler sends the token itself (see google_cloud_scheduler_job).
data "google_secret_manager_secret_version" "scheduler_token" {
  secret = local.secrets.LABKEEP_SCHEDULER_TOKEN
}

# Files the function reads, mounted from Secret Manager: the kubeconfig
# (no credential in it: kubeconfig.tftpl) and the lab catalog. A mounted
# secret's latest version is read at every read, so a new labs version
# reaches the functions through LABKEEP_LABS_RELOAD without a deploy.
data "google_container_cluster" "sessions" {
  name     = var.gke_cluster
  location = var.gke_location
}

resource "google_secret_manager_secret" "kubeconfig" {
  secret_id = "labkeep-kubeconfig-${var.env}"
  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_version" "kubeconfig" {
  secret = google_secret_manager_secret.kubeconfig.id
  secret_data = templatefile("${path.module}/kubeconfig.tftpl", {
    endpoint = data.google_container_cluster.sessions.endpoint
    ca_data  = data.google_container_cluster.sessions.master_auth[0].cluster_ca_certificate
    env      = var.env
  })
}

resource "google_secret_manager_secret" "labs" {
  secret_id = "labkeep-labs-${var.env}"
  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_version" "labs" {
  secret      = google_secret_manager_secret.labs.id
  secret_data = file("${path.module}/../base/labs.yaml")
}

resource "google_secret_manager_secret_iam_member" "functions_read_files" {
  for_each  = { kubeconfig = google_secret_manager_secret.kubeconfig.id, labs = google_secret_manager_secret.labs.id }
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.functions.email}"
}

# The source: stage.sh's layout (function package at the root), zipped.
data "archive_file" "source" {
  type        = "zip"
  source_dir  = "${path.module}/${var.source_dir}"
  output_path = "${path.module}/build/source.zip"
}

resource "google_storage_bucket" "source" {
  name                        = "${var.project}-${local.name}-source"
  location                    = var.region
  uniform_bucket_level_access = true
}

resource "google_storage_bucket_object" "source" {
  name   = "source-${data.archive_file.source.output_md5}.zip"
  bucket = google_storage_bucket.source.name
  source = data.archive_file.source.output_path
}

resource "google_cloudfunctions2_function" "functions" {
  name     = "${local.name}-functions"
  location = var.region

  build_config {
    runtime     = var.runtime
    entry_point = "Labkeep"
    source {
      storage_source {
        bucket = google_storage_bucket.source.name
        object = google_storage_bucket_object.source.name
      }
    }
  }

  service_config {
    service_account_email = google_service_account.functions.email
    available_memory      = "512M"
    # Above LABKEEP_REAP_RUN_DEADLINE (default 50s).
    timeout_seconds = 60
    # One request at a time per instance, as on Lambda: small pools.
    max_instance_request_concurrency = 1
    max_instance_count               = var.max_instances
    ingress_settings                 = "ALLOW_ALL"
    vpc_connector                    = var.vpc_connector == "" ? null : var.vpc_connector
    environment_variables = {
      LABKEEP_ENV                 = var.env
      LABKEEP_NAMESPACE           = "labkeep-sessions-${var.env}"
      LABKEEP_PLATFORM_NAMESPACE  = "labkeep-${var.env}"
      LABKEEP_JWT_AUDIENCE        = var.jwt_audience
      LABKEEP_JWT_ISSUER          = var.jwt_issuer
      LABKEEP_MAX_CONCURRENT_VMS  = tostring(var.max_concurrent_vms)
      LABKEEP_MAX_CONCURRENT_PODS = tostring(var.max_concurrent_pods)
      LABKEEP_KUBECONFIG          = "/etc/labkeep-kube/kubeconfig"
      LABKEEP_LABS_FILE           = "/etc/labkeep/labs.yaml"
      LABKEEP_DB_MAX_CONNS        = "2"
      LABKEEP_REAP_DB_CONNS       = "1"
    }
    dynamic "secret_environment_variables" {
      for_each = local.secrets
      content {
        key        = secret_environment_variables.key
        project_id = var.project
        secret     = secret_environment_variables.value
        version    = "latest"
      }
    }
    secret_volumes {
      mount_path = "/etc/labkeep-kube"
      project_id = var.project
      secret     = google_secret_manager_secret.kubeconfig.secret_id
      versions {
        version = "latest"
        path    = "kubeconfig"
      }
    }
    secret_volumes {
      mount_path = "/etc/labkeep"
      project_id = var.project
      secret     = google_secret_manager_secret.labs.secret_id
      versions {
        version = "latest"
        path    = "labs.yaml"
      }
    }
  }

  depends_on = [
    google_secret_manager_secret_iam_member.functions_read,
    google_secret_manager_secret_iam_member.functions_read_files,
  ]
}

# Students' portal calls carry labkeep's own JWT, not a Google identity,
# so the function is public; every route authenticates on its own.
resource "google_cloud_run_service_iam_member" "public" {
  location = var.region
  service  = google_cloudfunctions2_function.functions.service_config[0].service
  role     = "roles/run.invoker"
  member   = "allUsers"
}

# reapTick every minute. reapTick authenticates with
# "Authorization: Bearer <LABKEEP_SCHEDULER_TOKEN>", and Cloud Scheduler's
# oidc_token would write that same header with a Google ID token, which
# reapTick refuses; so the job sends the scheduler token itself (it is
# kept in the job's definition and in Terraform's state: keep the state
# private). No retries: the next tick is a minute away.
resource "google_cloud_scheduler_job" "reap_tick" {
  name             = "${local.name}-reap-tick"
  region           = var.region
  schedule         = "* * * * *"
  time_zone        = "Etc/UTC"
  attempt_deadline = "60s"
  retry_config {
    retry_count = 0
  }
  http_target {
    http_method = "POST"
    uri         = "${google_cloudfunctions2_function.functions.url}/reapTick"
    headers = {
      "Authorization" = "Bearer ${data.google_secret_manager_secret_version.scheduler_token.secret_data}"
      "Content-Type"  = "application/json"
    }
    body = base64encode("{}")
  }
}

# Alerts: reapTick answering non-2xx (the scheduler's failed attempts),
# and the function's own 5xx answers (failed initialisation answers 500
# until it succeeds; provisioning and database failures).
resource "google_monitoring_alert_policy" "reap_tick_failing" {
  display_name          = "labkeep ${var.env}: reapTick failing"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  conditions {
    display_name = "Cloud Scheduler job ${google_cloud_scheduler_job.reap_tick.name} attempts fail"
    condition_threshold {
      filter          = "resource.type = \"cloud_scheduler_job\" AND resource.labels.job_id = \"${google_cloud_scheduler_job.reap_tick.name}\" AND metric.type = \"logging.googleapis.com/log_entry_count\" AND metric.labels.log = \"cloudscheduler.googleapis.com/executions\" AND metric.labels.severity = \"ERROR\""
      comparison      = "COMPARISON_GT"
      threshold_value = 2
      duration        = "0s"
      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_SUM"
      }
    }
  }
}

resource "google_monitoring_alert_policy" "function_5xx" {
  display_name          = "labkeep ${var.env}: function answers 5xx"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  conditions {
    display_name = "run.googleapis.com/request_count 5xx of ${google_cloudfunctions2_function.functions.name}"
    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND resource.labels.service_name = \"${google_cloudfunctions2_function.functions.name}\" AND metric.type = \"run.googleapis.com/request_count\" AND metric.labels.response_code_class = \"5xx\""
      comparison      = "COMPARISON_GT"
      threshold_value = 15
      duration        = "0s"
      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_SUM"
      }
    }
  }
}

output "url" {
  value = google_cloudfunctions2_function.functions.url
}

output "service_account_email" {
  value = google_service_account.functions.email
}
