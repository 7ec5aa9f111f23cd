{{/* The node DaemonSet: (list <name> <node values> <root>). The agent runs
as uid/gid 990 (the helper's --allowed-uid and socket group), with no
capabilities, no privilege, a read-only root and no AWS credentials;
node.helper.mode says where the privileged helper runs. */}}
{{- define "ebs-csi.node" -}}
{{- $name := index . 0 -}}
{{- $n := index . 1 -}}
{{- $root := index . 2 -}}
{{- $s := $root.Values.sidecars -}}
{{- $kubelet := trimSuffix "/" $n.kubeletPath -}}
{{- $standard := eq $n.helper.mode "standard" -}}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "ebs-csi.labels" $root | nindent 4 }}
  {{- with $n.daemonSetAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  revisionHistoryLimit: {{ $n.revisionHistoryLimit }}
  selector:
    matchLabels:
      app: {{ $name }}
  {{- with $n.updateStrategy }}
  updateStrategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  template:
    metadata:
      labels:
        app: {{ $name }}
        {{- include "ebs-csi.labels" $root | nindent 8 }}
        {{- with $n.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $n.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ $n.serviceAccount.name }}
      # Only the agent's container gets a token (node-reader-token below).
      automountServiceAccountToken: false
      {{- with $n.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- if $n.hostNetwork }}
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      {{- end }}
      {{- if $standard }}
      # The helper reads the node's mount table as PID 1's (a disk mounted
      # only on the host must look in use) and refuses to start without it.
      hostPID: true
      {{- end }}
      terminationGracePeriodSeconds: {{ $n.terminationGracePeriodSeconds }}
      nodeSelector:
        kubernetes.io/os: linux
        {{- if not $standard }}
        # Only nodes where the helper's systemd unit is installed: on any
        # other node the pod would wait forever for /run/ebs-csi.
        ebs.csi.aws.com/helper: installed
        {{- end }}
        {{- with $n.nodeSelector }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $n.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      tolerations:
        {{- if $n.tolerateAllTaints }}
        - operator: Exists
        {{- else }}
        # The startup taint the agent removes once it is ready.
        - key: ebs.csi.aws.com/agent-not-ready
          operator: Exists
          effect: NoExecute
        {{- with $n.tolerations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- end }}
      {{- with $n.dnsConfig }}
      dnsConfig:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . }}
        {{- end }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        runAsUser: 990
        runAsGroup: 990
        seccompProfile:
          type: RuntimeDefault
      initContainers:
        # kubelet creates the plugin directory owned by root; the agent
        # (uid 990) must create its socket there: only CAP_CHOWN, once.
        - name: plugin-dir-owner
          image: {{ include "ebs-csi.image" (list $root.Values.image $root) }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: [/usr/bin/ebs-csi-agent, plugin-dir, --uid=990, --gid=990, /csi]
          securityContext:
            runAsNonRoot: false
            runAsUser: 0
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            privileged: false
            capabilities:
              drop: [ALL]
              add: [CHOWN]
          volumeMounts:
            - name: plugin-dir
              mountPath: /csi
        {{- with $n.initContainers }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      containers:
        - name: ebs-plugin
          image: {{ include "ebs-csi.image" (list $root.Values.image $root) }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: [/usr/bin/ebs-csi-agent]
          args:
            - --endpoint=unix:///csi/csi.sock
            - --helper-socket=/run/ebs-csi/helper.sock
            {{- with $n.volumeAttachLimit }}
            - --volume-attach-limit={{ . }}
            {{- end }}
            {{- if and (not (kindIs "invalid" $n.reservedVolumeAttachments)) (ne (int $n.reservedVolumeAttachments) -1) }}
            - --reserved-volume-attachments={{ $n.reservedVolumeAttachments }}
            {{- end }}
            {{- with $n.metadataSources }}
            - --metadata-sources={{ . }}
            {{- end }}
            {{- if $n.legacyXFS }}
            - --legacy-xfs=true
            {{- end }}
            {{- if $n.enableMetrics }}
            - --http-endpoint=0.0.0.0:3302
            {{- end }}
            {{- /* The reference chart's: statistics of the staged filesystems only. */}}
            - --csi-mount-point-prefix={{ $kubelet }}/plugins/kubernetes.io/csi/ebs.csi.aws.com/
            - --logging-format={{ $n.loggingFormat }}
            - --v={{ ternary 7 $n.logLevel $root.Values.debugLogs }}
            {{- if $n.otelTracing }}
            - --enable-otel-tracing=true
            {{- end }}
            {{- if $root.Values.fips }}
            - --fips=true
            {{- end }}
            {{- range $n.additionalArgs }}
            - {{ . }}
            {{- end }}
          env:
            # The Node object the `kubernetes` metadata source reads.
            - name: CSI_NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            {{- if $root.Values.proxy.http_proxy }}
            {{- include "ebs-csi.proxy" $root | nindent 12 }}
            {{- end }}
            {{- with $n.otelTracing }}
            {{- include "ebs-csi.otel" . | nindent 12 }}
            {{- end }}
            {{- with $n.env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with $n.envFrom }}
          envFrom:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          # While the node is drained, wait (within the grace period) until
          # its volumes are detached, so kubelet can still unstage them.
          lifecycle:
            preStop:
              exec:
                command: [/usr/bin/ebs-csi-agent, pre-stop]
          ports:
            - name: healthz
              containerPort: 9808
            {{- if $n.enableMetrics }}
            - name: metrics
              containerPort: 3302
            {{- end }}
          livenessProbe:
            httpGet:
              path: /healthz
              port: healthz
            initialDelaySeconds: 10
            periodSeconds: 10
            timeoutSeconds: 3
            failureThreshold: 5
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            privileged: false
            capabilities:
              drop: [ALL]
          # Not kubelet's default, /dev/termination-log: /dev here is the
          # host's, read-only, where the runtime cannot make the file's mount
          # point (a new node has none, and the container would not start).
          terminationMessagePath: /tmp/termination-log
          volumeMounts:
            - name: plugin-dir
              mountPath: /csi
            - name: node-reader-token
              mountPath: /var/run/secrets/kubernetes.io/serviceaccount
              readOnly: true
            - name: helper-socket
              mountPath: /run/ebs-csi
              readOnly: true
            # The helper's mounts, seen in the agent's mountinfo.
            - name: kubelet-dir
              mountPath: {{ $kubelet }}
              mountPropagation: HostToContainer
              readOnly: true
            # Device links and hot-plug events (inotify).
            - name: device-dir
              mountPath: /dev
              mountPropagation: HostToContainer
              readOnly: true
            {{- with $n.volumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with $n.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
        {{- if $standard }}
        # The only privileged container: it formats, mounts, unmounts and
        # grows filesystems for the agent, and nothing else.
        - name: ebs-csi-helper
          image: {{ include "ebs-csi.image" (list $n.helper.image $root) }}
          imagePullPolicy: {{ $n.helper.image.pullPolicy }}
          command: [/usr/bin/ebs-csi-helper]
          args:
            - --socket=/run/ebs-csi/helper.sock
            - --socket-group=990
            - --allowed-uid=990
            - --allowed-root={{ $kubelet }}
            {{- range $n.helper.additionalArgs }}
            - {{ . }}
            {{- end }}
          securityContext:
            runAsNonRoot: false
            runAsUser: 0
            runAsGroup: 0
            privileged: true
            readOnlyRootFilesystem: true
          # Not under /dev, the host's: nothing of the driver's is written there.
          terminationMessagePath: /tmp/termination-log
          volumeMounts:
            - name: helper-socket
              mountPath: /run/ebs-csi
            - name: kubelet-dir
              mountPath: {{ $kubelet }}
              mountPropagation: Bidirectional
            - name: device-dir
              mountPath: /dev
          {{- with $n.helper.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
        {{- end }}
        - name: node-driver-registrar
          {{- include "ebs-csi.sidecar" (list $s.nodeDriverRegistrar $root) | nindent 10 }}
          args:
            - --csi-address=$(ADDRESS)
            - --kubelet-registration-path=$(DRIVER_REG_SOCK_PATH)
            - --v={{ $s.nodeDriverRegistrar.logLevel }}
            {{- range $s.nodeDriverRegistrar.additionalArgs }}
            - {{ . }}
            {{- end }}
          env:
            - name: ADDRESS
              value: /csi/csi.sock
            - name: DRIVER_REG_SOCK_PATH
              value: {{ $kubelet }}/plugins/ebs.csi.aws.com/csi.sock
            {{- with $s.nodeDriverRegistrar.env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with $s.nodeDriverRegistrar.livenessProbe }}
          livenessProbe:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: plugin-dir
              mountPath: /csi
            - name: registration-dir
              mountPath: /registration
            # Where the registrar touches `registration` once kubelet has
            # asked for its info, and its exec probe looks for it: beside
            # --kubelet-registration-path, inside this container (the root
            # filesystem is read-only). As the Go chart mounts it.
            - name: probe-dir
              mountPath: {{ $kubelet }}/plugins/ebs.csi.aws.com/
        - name: liveness-probe
          {{- include "ebs-csi.sidecar" (list $s.livenessProbe $root) | nindent 10 }}
          args:
            - --csi-address=/csi/csi.sock
            - --http-endpoint=0.0.0.0:9808
            {{- range $s.livenessProbe.additionalArgs }}
            - {{ . }}
            {{- end }}
          volumeMounts:
            - name: plugin-dir
              mountPath: /csi
      volumes:
        # The agent's token and the cluster's CA, for its container alone.
        - name: node-reader-token
          projected:
            sources:
              - serviceAccountToken:
                  path: token
                  expirationSeconds: 3607
              - configMap:
                  name: kube-root-ca.crt
                  items:
                    - key: ca.crt
                      path: ca.crt
        - name: helper-socket
          {{- if $standard }}
          emptyDir: {}
          {{- else }}
          # Made by ebs-csi-helper.socket (root:ebs-csi 0660).
          hostPath:
            path: /run/ebs-csi
            type: Directory
          {{- end }}
        - name: plugin-dir
          hostPath:
            path: {{ $kubelet }}/plugins/ebs.csi.aws.com/
            type: DirectoryOrCreate
        - name: registration-dir
          hostPath:
            path: {{ $kubelet }}/plugins_registry/
            type: Directory
        - name: probe-dir
          emptyDir: {}
        - name: kubelet-dir
          hostPath:
            path: {{ $kubelet }}
            type: Directory
        - name: device-dir
          hostPath:
            path: /dev
            type: Directory
        {{- with $n.volumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
{{- end -}}
