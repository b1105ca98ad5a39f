{{/*
Hand-written helpers of the Understory chart. Every other template but certs.yaml,
validate.yaml, second-scheduler-metrics-reader.yaml and NOTES.txt is generated from
manifests/ (test/helmchart).
*/}}

{{/*
understory.koordletConfig: the agent's config.yaml. koordlet.config verbatim when set
(it must name the same cgroupDriver as the value), else the base's configuration
(files/koordlet/config.yaml, manifests/koordlet/configmap.yaml) with cgroupDriver set,
which is what manifests/components/systemd does for systemd.
*/}}
{{- define "understory.koordletConfig" -}}
{{- if .Values.koordlet.config -}}
{{- $c := fromYaml .Values.koordlet.config -}}
{{- if hasKey $c "Error" -}}
{{- fail (printf "koordlet.config is not a YAML mapping: %s" (index $c "Error")) -}}
{{- end -}}
{{- if ne (toString (index $c "cgroupDriver")) .Values.cgroupDriver -}}
{{- fail (printf "koordlet.config sets cgroupDriver %q but the value cgroupDriver is %q: set both alike (kubelet's cgroup driver)" (toString (index $c "cgroupDriver")) .Values.cgroupDriver) -}}
{{- end -}}
{{- .Values.koordlet.config -}}
{{- else -}}
{{- $base := .Files.Get "files/koordlet/config.yaml" -}}
{{- if not (contains "\ncgroupDriver: cgroupfs       #" $base) -}}
{{- fail "files/koordlet/config.yaml has no 'cgroupDriver: cgroupfs' line to set (regenerate the chart: test/helmchart)" -}}
{{- end -}}
{{- replace "\ncgroupDriver: cgroupfs       #" (printf "\ncgroupDriver: %-15s#" .Values.cgroupDriver) $base -}}
{{- end -}}
{{- end -}}

{{/*
understory.certs (certificates.mode self-signed): the CA and the certificates, made
once per render and kept in .Values._understoryCerts, so that certs.yaml and the
webhook's caBundle agree. On upgrade the Secrets in the cluster are read back
(lookup): the CA (Secret understory-ca) is kept, and so is every serving or client
certificate it signed that expires in more than 30 days; a missing or expiring one is
issued again from the kept CA. `helm template` has no cluster: it makes new ones every
time, unless certificates.pinned gives them (GitOps: the same on every render).
*/}}
{{- define "understory.certs" -}}
{{- if not (hasKey .Values "_understoryCerts") -}}
{{- $pinned := .Values.certificates.pinned -}}
{{- if $pinned.caCrt -}}
{{- /* Pinned (GitOps): the given PEM files, the same on every render. */ -}}
{{- $out := dict "caCrt" (b64enc $pinned.caCrt) "caKey" (b64enc (required "certificates.pinned.caKey is required with certificates.pinned.caCrt" $pinned.caKey)) -}}
{{- range $name := list "admission" "schedulerExtender" "schedulerClient" -}}
{{- $crt := required (printf "certificates.pinned.%sCrt is required with certificates.pinned.caCrt" $name) (index $pinned (printf "%sCrt" $name)) -}}
{{- $key := required (printf "certificates.pinned.%sKey is required with certificates.pinned.caCrt" $name) (index $pinned (printf "%sKey" $name)) -}}
{{- $_ := set $out $name (dict "crt" (b64enc $crt) "key" (b64enc $key) "notAfter" "") -}}
{{- end -}}
{{- $_ := set .Values "_understoryCerts" $out -}}
{{- else -}}
{{- $ns := "understory-system" -}}
{{- $ca := dict -}}
{{- $old := lookup "v1" "Secret" $ns "understory-ca" -}}
{{- if and $old (hasKey $old "data") (hasKey $old.data "tls.crt") (hasKey $old.data "tls.key") -}}
{{- $ca = buildCustomCert (index $old.data "tls.crt") (index $old.data "tls.key") -}}
{{- else -}}
{{- $ca = genCA "understory-ca" 3650 -}}
{{- end -}}
{{- $caCrt := b64enc $ca.Cert -}}
{{- $out := dict "caCrt" $caCrt "caKey" (b64enc $ca.Key) -}}
{{- $leaves := list
  (list "admission" "understory-admission-tls" (printf "understory-admission.%s.svc" $ns) (list (printf "understory-admission.%s.svc" $ns) (printf "understory-admission.%s.svc.cluster.local" $ns)))
  (list "schedulerExtender" "understory-scheduler-extender-tls" (printf "understory-scheduler-extender.%s.svc" $ns) (list (printf "understory-scheduler-extender.%s.svc" $ns) (printf "understory-scheduler-extender.%s.svc.cluster.local" $ns)))
  (list "schedulerClient" "understory-scheduler-client-tls" "understory-scheduler-client" list) -}}
{{- $rfc3339 := "2006-01-02T15:04:05Z07:00" -}}
{{- range $leaves -}}
{{- $name := index . 0 -}}
{{- $prev := lookup "v1" "Secret" $ns (index . 1) -}}
{{- /* A kept certificate must outlive the next 30 days: its Secret's
understory.io/not-after says when it expires (written with it; a Secret without
one, or with one that does not parse, is reissued). */ -}}
{{- $notAfter := "" -}}
{{- if $prev -}}{{- $notAfter = dig "metadata" "annotations" "understory.io/not-after" "" $prev -}}{{- end -}}
{{- $renewBy := 0 -}}
{{- if $notAfter -}}{{- $renewBy = toDate $rfc3339 $notAfter | dateModify "-720h" | unixEpoch | atoi -}}{{- end -}}
{{- if and $prev (hasKey $prev "data") (eq (toString (index $prev.data "ca.crt")) $caCrt) (hasKey $prev.data "tls.crt") (hasKey $prev.data "tls.key") (lt (now | unixEpoch | atoi) $renewBy) -}}
{{- $_ := set $out $name (dict "crt" (index $prev.data "tls.crt") "key" (index $prev.data "tls.key") "notAfter" $notAfter) -}}
{{- else -}}
{{- $c := genSignedCert (index . 2) nil (index . 3) 365 $ca -}}
{{- $_ := set $out $name (dict "crt" (b64enc $c.Cert) "key" (b64enc $c.Key) "notAfter" (dateInZone $rfc3339 (now | dateModify "+8760h") "UTC")) -}}
{{- end -}}
{{- end -}}
{{- $_ := set .Values "_understoryCerts" $out -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* understory.caBundle: the CA the webhook's caBundle trusts (self-signed mode). */}}
{{- define "understory.caBundle" -}}
{{- include "understory.certs" . -}}
{{- .Values._understoryCerts.caCrt -}}
{{- end -}}

{{/* understory.validate: fails the render on values the install cannot work with. */}}
{{- define "understory.validate" -}}
{{- if ne .Release.Namespace "understory-system" -}}
{{- fail (printf "install into namespace understory-system (helm install ... -n understory-system --create-namespace), not %q: the webhook's certificates, the scheduler configuration and the CEL policies name it literally" .Release.Namespace) -}}
{{- end -}}
{{- $_ := include "understory.koordletConfig" . -}}
{{- $sa := .Values.secondScheduler.prometheusServiceAccount -}}
{{- if ne (empty $sa.name) (empty $sa.namespace) -}}
{{- fail (printf "secondScheduler.prometheusServiceAccount: set both namespace and name (the service account Prometheus scrapes with), or neither; have namespace %q, name %q" $sa.namespace $sa.name) -}}
{{- end -}}
{{- end -}}

{{/*
understory.kubeSchedulerImage: the second scheduler's image: secondScheduler.image, or
upstream kube-scheduler at the cluster's version (.Capabilities.KubeVersion, its
distribution suffix dropped: v1.34.2-gke.1000 gives v1.34.2). The same version as the
API server is what the skew policy allows everywhere. helm template without a cluster
renders Helm's default version unless given --kube-version.
*/}}
{{- define "understory.kubeSchedulerImage" -}}
{{- if .Values.secondScheduler.image -}}
{{- .Values.secondScheduler.image -}}
{{- else -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{- printf "registry.k8s.io/kube-scheduler:v%d.%d.%d" $v.Major $v.Minor $v.Patch -}}
{{- end -}}
{{- end -}}
