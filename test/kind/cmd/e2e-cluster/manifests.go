package main

import (
	"bytes"
	"text/template"
)

// clusterConfig is the kind cluster: one control plane and two workers from the offline node image.
// Each node's /etc/cni/net.d is an empty directory of this run's (the node image's static bridge
// configuration, one /24 for every node, would give pods of different nodes the same addresses), so a
// node is NotReady until nodenet wrote its configuration there. The pod subnet is kind's default, made
// explicit: kubeadm then runs the controller manager with --allocate-node-cidrs and --cluster-cidr, which
// gives each node its spec.podCIDR. kube-proxy is kubeadm's own (iptables mode, kind's settings), its
// image built into the node image.
var clusterConfig = template.Must(template.New("kind").Parse(`kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
{{- range .Nodes }}
- role: {{ .Role }}
  extraMounts:
  - hostPath: {{ .CNIDir }}
    containerPath: /etc/cni/net.d
{{- end }}
# containerd reads registry host configuration from /etc/containerd/certs.d (kind's own docs do the
# same): make e2e-cluster-conformance points registry.k8s.io at a registry on the host there.
containerdConfigPatches:
- |-
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "/etc/containerd/certs.d"
kubeadmConfigPatches:
- |
  kind: KubeletConfiguration
  failCgroupV1: false
networking:
  disableDefaultCNI: true
  kubeProxyMode: iptables
  podSubnet: {{ .PodSubnet }}
  serviceSubnet: {{ .ServiceSubnet }}
`))

// nodenetManifest runs nodenet on every node. The API server is reached at the control plane's own
// address (the kubernetes Service needs kube-proxy, and kube-proxy's pods need nothing of nodenet, but
// nodenet must not wait for it).
var nodenetManifest = template.Must(template.New("nodenet").Parse(`apiVersion: v1
kind: ServiceAccount
metadata:
  name: nodenet
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: nodenet
rules:
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: nodenet
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: nodenet
subjects:
- kind: ServiceAccount
  name: nodenet
  namespace: kube-system
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: nodenet
  namespace: kube-system
  labels:
    app: nodenet
spec:
  selector:
    matchLabels:
      app: nodenet
  template:
    metadata:
      labels:
        app: nodenet
    spec:
      serviceAccountName: nodenet
      hostNetwork: true
      dnsPolicy: Default
      priorityClassName: system-node-critical
      tolerations:
      - operator: Exists
      containers:
      - name: nodenet
        image: {{ .Image }}
        imagePullPolicy: Never
        args: [-cluster-cidr={{ .PodSubnet }}]
        env:
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        - name: KUBERNETES_SERVICE_HOST
          value: {{ .APIServerHost }}
        - name: KUBERNETES_SERVICE_PORT
          value: "6443"
        securityContext:
          privileged: true
        resources:
          requests:
            cpu: 10m
            memory: 32Mi
        volumeMounts:
        - name: cni-conf
          mountPath: /etc/cni/net.d
      volumes:
      - name: cni-conf
        hostPath:
          path: /etc/cni/net.d
          type: Directory
`))

// serviceCheck is the Service check: an HTTP server on one worker behind a ClusterIP Service, and a
// client pod on the other worker.
var serviceCheck = template.Must(template.New("service").Parse(`apiVersion: v1
kind: Namespace
metadata:
  name: svc-check
---
apiVersion: v1
kind: Pod
metadata:
  name: server
  namespace: svc-check
  labels:
    app: server
spec:
  nodeName: {{ .ServerNode }}
  containers:
  - name: httpd
    image: {{ .Busybox }}
    imagePullPolicy: Never
    command: [sh, -c, 'mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www']
    ports:
    - containerPort: 8080
    readinessProbe:
      tcpSocket:
        port: 8080
      periodSeconds: 2
---
apiVersion: v1
kind: Service
metadata:
  name: server
  namespace: svc-check
spec:
  selector:
    app: server
  ports:
  - port: 80
    targetPort: 8080
---
apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: svc-check
spec:
  nodeName: {{ .ClientNode }}
  containers:
  - name: client
    image: {{ .Busybox }}
    imagePullPolicy: Never
    command: [sleep, "3600"]
`))

// drainCheck is a Deployment the scheduler places on one node (a node selector, not a nodeName, so
// that a cordon keeps its replacements off the node), for the drain: its pods are evicted, stay
// Pending while the node is cordoned, and come back once it is uncordoned.
var drainCheck = template.Must(template.New("drain").Parse(`apiVersion: v1
kind: Namespace
metadata:
  name: drain-check
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: placed
  namespace: drain-check
spec:
  replicas: {{ .Replicas }}
  selector:
    matchLabels:
      app: placed
  template:
    metadata:
      labels:
        app: placed
    spec:
      nodeSelector:
        kubernetes.io/hostname: {{ .Node }}
      terminationGracePeriodSeconds: 5
      containers:
      - name: httpd
        image: {{ .Busybox }}
        imagePullPolicy: Never
        command: [sh, -c, 'mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www']
        readinessProbe:
          httpGet:
            path: /index.html
            port: 8080
          periodSeconds: 2
`))

// dashboardNamespace holds dashboardActivity's pods.
const dashboardNamespace = "dashboard-check"

// dashboardActivity is a pod on every node (the control plane too) that runs for two seconds and ends,
// while the dashboard's panels are read.
var dashboardActivity = template.Must(template.New("dashboard-activity").Parse(`
{{- range $i, $n := .Nodes }}
---
apiVersion: v1
kind: Pod
metadata:
  name: activity-{{ $i }}
  namespace: {{ $.Namespace }}
spec:
  nodeName: {{ $n }}
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  tolerations:
  - operator: Exists
  containers:
  - name: c
    image: {{ $.Busybox }}
    imagePullPolicy: Never
    command: [sleep, "2"]
{{- end }}
`))

// workloads are what every node runs with pleg-nri in place (the control plane included, whose taint
// they tolerate): a crash-looping container, a Deployment behind the Service "web" (one replica per
// node, so the Service has an endpoint on each), a Job, and pods with probes: one whose probes pass
// (startup, liveness and readiness), one whose liveness probe starts failing (the kubelet restarts its
// container), one whose readiness probe never passes (Running, never Ready).
var workloads = template.Must(template.New("workloads").Parse(`apiVersion: v1
kind: Namespace
metadata:
  name: workloads
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: workloads
spec:
  selector:
    app: web
  ports:
  - port: 80
    targetPort: 8080
{{- range $i, $n := .Nodes }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: crasher-{{ $i }}
  namespace: workloads
spec:
  replicas: 1
  selector:
    matchLabels:
      app: crasher
      node: "{{ $i }}"
  template:
    metadata:
      labels:
        app: crasher
        node: "{{ $i }}"
    spec:
      nodeName: {{ $n }}
      terminationGracePeriodSeconds: 1
      containers:
      - name: app
        image: {{ $.Busybox }}
        imagePullPolicy: Never
        command: [sh, -c, 'sleep 2; exit 3']
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web-{{ $i }}
  namespace: workloads
spec:
  replicas: 1
  selector:
    matchLabels:
      app: web
      node: "{{ $i }}"
  template:
    metadata:
      labels:
        app: web
        node: "{{ $i }}"
    spec:
      nodeName: {{ $n }}
      terminationGracePeriodSeconds: 1
      containers:
      - name: httpd
        image: {{ $.Busybox }}
        imagePullPolicy: Never
        command: [sh, -c, 'mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www']
        readinessProbe:
          httpGet:
            path: /index.html
            port: 8080
          periodSeconds: 2
---
apiVersion: batch/v1
kind: Job
metadata:
  name: job-{{ $i }}
  namespace: workloads
spec:
  # A pod the runtime could not start is retried; one that ran and failed fails the run (checkJobFailures).
  backoffLimit: 2
  template:
    spec:
      nodeName: {{ $n }}
      restartPolicy: Never
      containers:
      - name: job
        image: {{ $.Busybox }}
        imagePullPolicy: Never
        command: [sh, -c, 'sleep 2; echo done']
---
apiVersion: v1
kind: Pod
metadata:
  name: probes-{{ $i }}
  namespace: workloads
spec:
  nodeName: {{ $n }}
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {{ $.Busybox }}
    imagePullPolicy: Never
    command: [sh, -c, 'mkdir -p /www && hostname > /www/index.html && touch /tmp/started && exec httpd -f -p 8080 -h /www']
    startupProbe:
      exec:
        command: [test, -f, /tmp/started]
      periodSeconds: 1
      failureThreshold: 30
    # The passing probes' timeouts are ones a node the cluster saturates still meets (the default 1 s
    # was missed at CPU pressure 97 % on two cores, and the kubelet restarted a healthy container):
    # this pod checks that no restart comes from anywhere but its probes' verdicts, not httpd's latency.
    livenessProbe:
      httpGet:
        path: /index.html
        port: 8080
      periodSeconds: 2
      timeoutSeconds: 10
      failureThreshold: 6
    readinessProbe:
      tcpSocket:
        port: 8080
      periodSeconds: 2
      timeoutSeconds: 10
---
apiVersion: v1
kind: Pod
metadata:
  name: liveness-{{ $i }}
  namespace: workloads
spec:
  nodeName: {{ $n }}
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {{ $.Busybox }}
    imagePullPolicy: Never
    command: [sh, -c, 'touch /tmp/healthy; sleep 5; rm /tmp/healthy; exec sleep 3600']
    livenessProbe:
      exec:
        command: [test, -f, /tmp/healthy]
      periodSeconds: 1
      failureThreshold: 2
---
apiVersion: v1
kind: Pod
metadata:
  name: unready-{{ $i }}
  namespace: workloads
spec:
  nodeName: {{ $n }}
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {{ $.Busybox }}
    imagePullPolicy: Never
    command: [sleep, "3600"]
    readinessProbe:
      exec:
        command: ["false"]
      periodSeconds: 1
{{- end }}
`))

func render(t *template.Template, data any) (string, error) {
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return "", err
	}
	return b.String(), nil
}
