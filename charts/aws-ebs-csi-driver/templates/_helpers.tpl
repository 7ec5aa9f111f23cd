{{/* Labels on every object: the chart's, then customLabels. */}}
{{- define "ebs-csi.labels" -}}
app.kubernetes.io/name: aws-ebs-csi-driver
app.kubernetes.io/part-of: ebs-csi
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.customLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* An image reference from {repository, tag}; the tag defaults to the
chart's appVersion. */}}
{{- define "ebs-csi.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) -}}
{{- end -}}

{{/* A sidecar's image, pull policy, resources, env and securityContext:
(list <sidecar values> <root>). */}}
{{- define "ebs-csi.sidecar" -}}
{{- $sidecar := index . 0 -}}
image: {{ include "ebs-csi.image" (list $sidecar.image (index . 1)) }}
imagePullPolicy: {{ $sidecar.image.pullPolicy }}
{{- with $sidecar.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $sidecar.securityContext | nindent 2 }}
{{- end -}}

{{/* Leader election flags of a controller sidecar. */}}
{{- define "ebs-csi.leaderElection" -}}
- --leader-election={{ .leaderElection.enabled }}
{{- range $flag := list "leaseDuration" "renewDeadline" "retryPeriod" }}
{{- with index $.leaderElection $flag }}
- --leader-election-{{ kebabcase $flag }}={{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The controller sidecars' client-side limits on their Kubernetes API
calls, the reference chart's (client-go's own default, 5 and 10, throttles
the sidecars of a busy cluster; ../shared/reviews/parity-go-driver.md, the
sidecars' row). A sidecar's additionalArgs come after, and a flag given
twice takes its last value. */}}
{{- define "ebs-csi.kubeApiLimits" -}}
- --kube-api-qps=20
- --kube-api-burst=100
{{- end -}}

{{/* extraVolumeTags as the controller's --extra-tags: key=value,… in key
order. */}}
{{- define "ebs-csi.tags" -}}
{{- $pairs := list -}}
{{- range $key, $value := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* The static credentials of awsAccessSecret, as the reference chart
passes them: optional, so that a cluster without the Secret uses the
ServiceAccount's role. */}}
{{/*
The reference chart's proxy, where proxy.http_proxy is set: HTTP_PROXY and
HTTPS_PROXY are proxy.http_proxy, NO_PROXY proxy.no_proxy (the AWS SDK's
default client reads all three).
*/}}
{{- define "ebs-csi.proxy" -}}
- name: HTTP_PROXY
  value: {{ .Values.proxy.http_proxy | quote }}
- name: HTTPS_PROXY
  value: {{ .Values.proxy.http_proxy | quote }}
- name: NO_PROXY
  value: {{ .Values.proxy.no_proxy | default "" | quote }}
{{- end -}}

{{- /*
The reference chart's otelTracing of a component (its argument): the
spans' service name and the OTLP/gRPC collector, as the OpenTelemetry
SDK's variables, each where it is set.
*/}}
{{- define "ebs-csi.otel" -}}
{{- with .otelServiceName }}
- name: OTEL_SERVICE_NAME
  value: {{ . | quote }}
{{- end }}
{{- with .otelExporterEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "ebs-csi.awsAccessSecret" -}}
{{- with .Values.awsAccessSecret -}}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .keyId }}
      optional: true
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .accessKey }}
      optional: true
{{- end -}}
{{- end -}}

{{/* Egress every pod of the driver needs: DNS, HTTPS to AWS's endpoints and
the API server (443, 6443), and IMDS (IPv4 and IPv6). */}}
{{- define "ebs-csi.egress" -}}
- ports:
    - {protocol: UDP, port: 53}
    - {protocol: TCP, port: 53}
- ports:
    - {protocol: TCP, port: 443}
    - {protocol: TCP, port: 6443}
- to:
    - ipBlock: {cidr: 169.254.169.254/32}
    - ipBlock: {cidr: "fd00:ec2::254/128"}
  ports:
    - {protocol: TCP, port: 80}
{{- end -}}

{{/*
A ServiceMonitor of the metrics Service `name` on `port`, as the reference
chart renders one (templates/_metrics.tpl): where the cluster serves
monitoring.coreos.com/v1 ServiceMonitors (the Prometheus Operator), or
forced. Arguments: (list name port serviceMonitor root).
*/}}
{{- define "ebs-csi.serviceMonitor" -}}
{{- $name := index . 0 -}}
{{- $port := index . 1 -}}
{{- $m := index . 2 -}}
{{- $root := index . 3 -}}
{{- if or $m.forceEnable ($root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor") }}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    app: {{ $name }}
    {{- include "ebs-csi.labels" $root | nindent 4 }}
    {{- with $m.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      app: {{ $name }}
  namespaceSelector:
    matchNames:
      - {{ $root.Release.Namespace }}
  endpoints:
    - targetPort: {{ $port }}
      path: /metrics
      interval: {{ $m.interval | default "15s" }}
      {{- with $m.relabelings }}
      relabelings:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}
{{- end -}}
