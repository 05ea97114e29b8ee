{{- define "pleg-nri.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pleg-nri.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "pleg-nri.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The node agent's pod: host PID namespace (nsenter -t 1 runs the host's systemctl), host network
(pleg-nri's /readyz on loopback), privileged, the host's / at /host. */}}
{{- define "pleg-nri.nodePod" -}}
hostPID: true
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
automountServiceAccountToken: false
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
nodeSelector:
  kubernetes.io/os: linux
  {{- with .Values.nodeSelector }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
volumes:
  - name: host
    hostPath:
      path: /
      type: Directory
  - name: config
    configMap:
      name: {{ include "pleg-nri.fullname" . }}
{{- end -}}

{{- define "pleg-nri.nodeContainer" -}}
image: {{ include "pleg-nri.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
securityContext:
  privileged: true
env:
  - name: HOST_ROOT
    value: /host
  - name: PLEG_NRI_MODE
    value: {{ .Values.mode | quote }}
  - name: PLEG_NRI_CONFIG
    value: /etc/pleg-nri-config/config.yaml
  - name: PLEG_NRI_READYZ
    value: {{ printf "http://%s/readyz" (index .Values.config "metrics-address") | quote }}
  - name: PLEG_NRI_READY_TIMEOUT
    value: {{ .Values.readyTimeoutSeconds | quote }}
  - name: PLEG_NRI_HEALTH_TIMEOUT
    value: {{ (.Values.readiness | default dict).checkTimeoutSeconds | default 2 | quote }}
  - name: PLEG_NRI_HEALTH_ADDRESS
    value: {{ printf "127.0.0.1:%v" ((.Values.readiness | default dict).port | default 9811) | quote }}
  - name: PLEG_NRI_SWITCH_KUBELET
    value: {{ .Values.kubelet.switchEndpoint | quote }}
  - name: PLEG_NRI_EVENTED_PLEG
    value: {{ .Values.kubelet.eventedPLEG | quote }}
  {{- /* Absent (values of an older chart kept with --reuse-values): node.sh's default, containerd's socket. */}}
  {{- if hasKey .Values.kubelet "imageServiceEndpoint" }}
  - name: PLEG_NRI_IMAGE_ENDPOINT
    value: {{ .Values.kubelet.imageServiceEndpoint | default "" | quote }}
  {{- end }}
  - name: PLEG_NRI_RESTART_KUBELET_AFTER_RESTART
    value: {{ .Values.kubelet.restartAfterPlegNRIRestart | quote }}
  - name: PLEG_NRI_REAPPLY_SWITCH
    value: {{ .Values.kubelet.reapplySwitch | default false | quote }}
  - name: PLEG_NRI_KUBELET_DROPIN_DIR
    value: {{ .Values.kubelet.dropinDir | default "" | quote }}
  - name: PLEG_NRI_ENDPOINT
    value: {{ index .Values.config "listen" | default "unix:///run/pleg-nri/cri.sock" | quote }}
  - name: PLEG_NRI_RESTORE_ENDPOINT
    value: {{ .Values.kubelet.restoreEndpoint | quote }}
  - name: KUBELET_CONFIG
    value: {{ .Values.kubelet.configPath | quote }}
  - name: KUBEADM_FLAGS
    value: {{ .Values.kubelet.kubeadmFlagsPath | quote }}
  - name: KUBELET_UNIT
    value: {{ .Values.kubelet.unit | quote }}
  - name: PLEG_NRI_CONTAINERD_CONFIG
    value: {{ (.Values.containerd | default dict).configPath | default "/etc/containerd/config.toml" | quote }}
  - name: PLEG_NRI_CONTAINERD_NRI_REGISTRATION_TIMEOUT
    value: {{ ((.Values.containerd | default dict).nri | default dict).pluginRegistrationTimeout | default "" | quote }}
  - name: PLEG_NRI_CONTAINERD_NRI_REQUEST_TIMEOUT
    value: {{ ((.Values.containerd | default dict).nri | default dict).pluginRequestTimeout | default "" | quote }}
volumeMounts:
  - name: host
    mountPath: /host
  - name: config
    mountPath: /etc/pleg-nri-config
    readOnly: true
{{- end -}}

{{/* The values blocks added after the chart's first release, with their defaults where a release's
values lack them (helm upgrade --reuse-values keeps the old release's values, not the new defaults). */}}
{{- define "pleg-nri.scrapeAnnotations" -}}
{{- $m := .Values.metrics | default dict -}}
{{- if or (not (hasKey $m "scrapeAnnotations")) $m.scrapeAnnotations -}}
true
{{- end -}}
{{- end -}}

{{/* The port of config.metrics-address (host:port). */}}
{{- define "pleg-nri.metricsPort" -}}
{{- $addr := index .Values.config "metrics-address" | toString -}}
{{- regexReplaceAll "^.*:" $addr "" -}}
{{- end -}}

{{/* "true" when config.metrics-address listens beyond loopback (a scraper can reach it at the pod's
address, the node's: the pod is hostNetwork), else empty. */}}
{{- define "pleg-nri.metricsReachable" -}}
{{- $addr := index .Values.config "metrics-address" | toString -}}
{{- $host := regexReplaceAll ":[0-9]+$" $addr "" | trimPrefix "[" | trimSuffix "]" -}}
{{- if not (or (hasPrefix "127." $host) (eq $host "localhost") (eq $host "::1")) -}}
true
{{- end -}}
{{- end -}}
