{{/*
Names, labels, and the plugin's config file. The config file is built in one place
("nvplugin.configData") and used by the ConfigMap and by the checksum/config annotation, so the
annotation changes exactly when the file does.
*/}}

{{- define "nvplugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nvplugin.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "nvplugin.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nvplugin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels. The pods' labels are name and instance, plus NVIDIA's selectorLabelsOverride (which, when
set, is the DaemonSet's whole selector, as in NVIDIA's chart) and, with NVIDIA's
componentSelectorLabels.enabled, app.kubernetes.io/component. As JSON maps, merged without
duplicate keys.
*/}}
{{- define "nvplugin.templateLabels" -}}
{{- $labels := dict "app.kubernetes.io/name" (include "nvplugin.name" .) "app.kubernetes.io/instance" .Release.Name }}
{{- $labels = merge (deepCopy (.Values.selectorLabelsOverride | default dict)) $labels }}
{{- $labels = merge (include "nvplugin.componentLabel" . | fromJson) $labels }}
{{- toJson $labels }}
{{- end }}

{{- define "nvplugin.componentLabel" -}}
{{- if (.Values.componentSelectorLabels | default dict).enabled }}
{{- dict "app.kubernetes.io/component" "device-plugin" | toJson }}
{{- else }}
{{- dict | toJson }}
{{- end }}
{{- end }}

{{- define "nvplugin.selectorLabels" -}}
{{- if .Values.selectorLabelsOverride }}
{{- merge (include "nvplugin.componentLabel" . | fromJson) (deepCopy .Values.selectorLabelsOverride) | toYaml }}
{{- else }}
{{- merge (include "nvplugin.componentLabel" . | fromJson) (dict "app.kubernetes.io/name" (include "nvplugin.name" .) "app.kubernetes.io/instance" .Release.Name) | toYaml }}
{{- end }}
{{- end }}

{{- define "nvplugin.labels" -}}
{{- $labels := include "nvplugin.templateLabels" . | fromJson }}
{{- $_ := set $labels "helm.sh/chart" (include "nvplugin.chart" .) }}
{{- $_ := set $labels "app.kubernetes.io/version" .Chart.AppVersion }}
{{- $_ := set $labels "app.kubernetes.io/managed-by" .Release.Service }}
{{- toYaml $labels }}
{{- end }}

{{- define "nvplugin.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The plugin socket: <devicePluginPath>/nvplugin-<part of resourceName after "/">.sock, the name
`nvplugin serve` gives its socket (nvplugin/resourcenames.py: socket_name).
*/}}
{{- define "nvplugin.socketPath" -}}
{{- printf "%s/nvplugin-%s.sock" (trimSuffix "/" .Values.devicePluginPath) (last (splitList "/" .Values.resourceName)) }}
{{- end }}

{{- define "nvplugin.configDir" -}}/etc/nvplugin{{- end }}
{{- define "nvplugin.driverRoot" -}}/driver-root{{- end }}

{{- define "nvplugin.configMapName" -}}
{{- if .Values.config.name }}
{{- .Values.config.name }}
{{- else }}
{{- printf "%s-config" (include "nvplugin.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{/*
One entry of config.map as a mapping: a mapping as given, a string parsed as YAML (or JSON).
args: name, value. Fails naming the entry when the string is not a YAML mapping.
*/}}
{{- define "nvplugin.parseConfig" -}}
{{- if kindIs "string" .value }}
{{- if not (trim .value) }}
{{- dict | toJson }}
{{- else }}
{{- $cfg := fromYaml .value }}
{{- if hasKey $cfg "Error" }}
{{- fail (printf "values.config.map.%s: not a YAML mapping (the plugin's config file): %s" .name (get $cfg "Error")) }}
{{- end }}
{{- $cfg | toJson }}
{{- end }}
{{- else }}
{{- .value | default dict | toJson }}
{{- end }}
{{- end }}

{{/*
The first problem of a value against a JSON Schema (the subset charts/generate_schema.py writes
from the plugin's config model: type, enum, pattern, minimum, maximum, properties,
additionalProperties false, required, items, minItems, uniqueItems, anyOf, and the plugin's
x-nvplugin-supported: the only values of an NVIDIA setting nvplugin accepts), or "" when it has
none. args: value, schema, path (the key path so far).
*/}}
{{- define "nvplugin.schemaError" -}}
{{- $v := .value }}
{{- $s := .schema }}
{{- $p := .path }}
{{- $err := "" }}
{{- $kind := "" }}
{{- if kindIs "invalid" $v }}{{ $kind = "null" }}
{{- else if kindIs "bool" $v }}{{ $kind = "boolean" }}
{{- else if kindIs "string" $v }}{{ $kind = "string" }}
{{- else if kindIs "map" $v }}{{ $kind = "object" }}
{{- else if kindIs "slice" $v }}{{ $kind = "array" }}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) }}{{ $kind = "integer" }}
{{- else if kindIs "float64" $v }}{{ $kind = ternary "integer" "number" (eq (floor $v) $v) }}
{{- end }}
{{- $where := ternary "" (printf "key %q: " $p) (eq $p "") }}
{{- if hasKey $s "anyOf" }}
{{- $ok := false }}
{{- $first := "" }}
{{- range $s.anyOf }}
{{- if not $ok }}
{{- $e := include "nvplugin.schemaError" (dict "value" $v "schema" . "path" $p) }}
{{- if not $e }}{{ $ok = true }}{{ else if not $first }}{{ $first = $e }}{{ end }}
{{- end }}
{{- end }}
{{- if not $ok }}{{ $err = $first }}{{ end }}
{{- end }}
{{- if and (not $err) (hasKey $s "type") }}
{{- $types := $s.type }}
{{- if kindIs "string" $types }}{{ $types = list $types }}{{ end }}
{{- if not (or (has $kind $types) (and (eq $kind "integer") (has "number" $types))) }}
{{- $err = printf "%sexpected %s, got %s %s" $where (join " or " $types) $kind (toJson $v | trunc 80) }}
{{- end }}
{{- end }}
{{- if and (not $err) (hasKey $s "enum") (not (has (toJson $v) (without (splitList "\n" (include "nvplugin.jsonLines" $s.enum)) ""))) }}
{{- $err = printf "%s%s is not one of %s" $where (toJson $v | trunc 80) (join ", " $s.enum) }}
{{- end }}
{{- if and (not $err) (eq $kind "string") (hasKey $s "pattern") (not (regexMatch $s.pattern $v)) }}
{{- $err = printf "%s%s does not match %s" $where (toJson $v | trunc 80) $s.pattern }}
{{- end }}
{{- if and (not $err) (or (eq $kind "integer") (eq $kind "number")) }}
{{- if and (hasKey $s "minimum") (lt (float64 $v) (float64 $s.minimum)) }}
{{- $err = printf "%s%v is less than %v" $where $v $s.minimum }}
{{- else if and (hasKey $s "maximum") (gt (float64 $v) (float64 $s.maximum)) }}
{{- $err = printf "%s%v is more than %v" $where $v $s.maximum }}
{{- end }}
{{- end }}
{{- if and (not $err) (eq $kind "object") (hasKey $s "properties") }}
{{- $props := $s.properties }}
{{- range $key := keys $v | sortAlpha }}
{{- if not $err }}
{{- $sub := ternary $key (printf "%s.%s" $p $key) (eq $p "") }}
{{- if hasKey $props $key }}
{{- $err = include "nvplugin.schemaError" (dict "value" (get $v $key) "schema" (get $props $key) "path" $sub) }}
{{- else if eq (toJson (get $s "additionalProperties")) "false" }}
{{- $err = printf "unknown key %q; valid keys here: %s" $sub (join ", " (keys $props | sortAlpha)) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $s.required }}
{{- if and (not $err) (not (hasKey $v .)) }}
{{- $err = printf "key %q: is missing" (ternary . (printf "%s.%s" $p .) (eq $p "")) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (not $err) (eq $kind "array") }}
{{- if and (hasKey $s "minItems") (lt (len $v) (int $s.minItems)) }}
{{- $err = printf "%sexpected at least %v item(s)" $where $s.minItems }}
{{- else if and (hasKey $s "uniqueItems") $s.uniqueItems (ne (len $v) (len (uniq $v))) }}
{{- $err = printf "%sa value is listed twice" $where }}
{{- end }}
{{- if and (not $err) (hasKey $s "items") }}
{{- range $i, $item := $v }}
{{- if not $err }}
{{- $err = include "nvplugin.schemaError" (dict "value" $item "schema" $s.items "path" (printf "%s[%d]" $p $i)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (not $err) (hasKey $s "x-nvplugin-supported") }}
{{- if not (has (toJson $v) (without (splitList "\n" (include "nvplugin.jsonLines" (get $s "x-nvplugin-supported"))) "")) }}
{{- $err = printf "%s%s" $where (get $s "x-nvplugin-unsupported") }}
{{- end }}
{{- end }}
{{- $err }}
{{- end }}

{{/* Each item of a list as JSON, one per line (to compare values whatever their number types). */}}
{{- define "nvplugin.jsonLines" -}}
{{- range . }}
{{ toJson . }}
{{- end }}
{{- end }}

{{/*
config.map checked: every entry against the plugin's config schema (config.schema.json, written
from the plugin's config model by charts/generate_schema.py). Returns the entries as
{name: YAML text}.
*/}}
{{- define "nvplugin.configEntries" -}}
{{- $problems := include "nvplugin.configProblems" . | fromJsonArray }}
{{- if $problems }}{{ fail (first $problems) }}{{ end }}
{{- $out := dict }}
{{- range $name, $value := .Values.config.map }}
{{- $_ := set $out $name (ternary $value (toYaml $value) (kindIs "string" $value)) }}
{{- end }}
{{- $out | toJson }}
{{- end }}

{{/* What the plugin would refuse in config.map's entries, one message per entry (JSON list). */}}
{{- define "nvplugin.configProblems" -}}
{{- $schema := .Files.Get "config.schema.json" | fromJson }}
{{- $out := list }}
{{- range $name, $value := .Values.config.map }}
{{- $cfg := include "nvplugin.parseConfig" (dict "name" $name "value" $value) | fromJson }}
{{- $err := include "nvplugin.schemaError" (dict "value" $cfg "schema" $schema "path" "") }}
{{- if $err }}
{{- $out = append $out (printf "values.config.map.%s: %s (nvplugin's config file: NVIDIA's v1 format plus nvplugin's keys)" $name $err) }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
Per-node configs: on whenever the chart has a ConfigMap of config files (config.map or
config.name), as NVIDIA's chart runs its config manager then. The whole ConfigMap is mounted as
the plugin's CONFIG_FILE_SRCDIR; each node's plugin runs the file its nvidia.com/device-plugin.config
label names, else config.default, else the first of config.fallbackStrategies that finds one, and
follows the label and the ConfigMap while it runs.
*/}}
{{- define "nvplugin.perNode" -}}
{{- if or .Values.config.name .Values.config.map }}true{{ end }}
{{- end }}

{{/*
config.default must name a config file, where the chart can see them (config.map; config.name in
a cluster through lookup). Returns the problem (nvplugin.validate lists it), or nothing.
*/}}
{{- define "nvplugin.defaultProblem" -}}
{{- if .Values.config.default }}
{{- $keys := list }}
{{- $known := true }}
{{- if .Values.config.name }}
{{- $cm := lookup "v1" "ConfigMap" (include "nvplugin.namespace" .) .Values.config.name }}
{{- if $cm }}{{ $keys = keys ($cm.data | default dict) | sortAlpha }}{{ else }}{{ $known = false }}{{ end }}
{{- else }}
{{- $keys = keys .Values.config.map | sortAlpha }}
{{- end }}
{{- if and $known (not (has .Values.config.default $keys)) }}
{{- printf "values.config.default is %q, but the config files are: %s" .Values.config.default (join ", " $keys) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
NVIDIA's chart's rule (nvplugin/chart/values.py: no_default_problem): a config.map must give
every node a config without its label -- config.default, or a fallback strategy that finds one
among the entries (named: an entry called "default"; single: exactly one entry; empty) -- else
rendering fails with NVIDIA's message. args: Values, message (settings.json "noDefault").
*/}}
{{- define "nvplugin.noDefaultProblem" -}}
{{- $map := .Values.config.map | default dict }}
{{- $fallbacks := .Values.config.fallbackStrategies | default list }}
{{- if and $map (not .Values.config.default) }}
{{- $found := or (and (has "named" $fallbacks) (hasKey $map "default")) (and (has "single" $fallbacks) (eq (len $map) 1)) (has "empty" $fallbacks) }}
{{- if not $found }}
{{- printf "values.config.map: %s (config.fallbackStrategies: [%s]; config.map's entries: %s)" .message (join ", " $fallbacks) (join ", " (keys $map | sortAlpha)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The ServiceAccount the plugin reads its Node with (per-node configs only). */}}
{{- define "nvplugin.serviceAccountName" -}}
{{- include "nvplugin.fullname" . }}
{{- end }}

{{/* The ClusterRole and its binding: cluster-wide names, so the namespace is part of them. */}}
{{- define "nvplugin.clusterRoleName" -}}
{{- printf "%s-%s-node-reader" (include "nvplugin.namespace" .) (include "nvplugin.fullname" .) | trunc 253 }}
{{- end }}

{{/*
The chart values that set the plugin's settings, and how each reaches the plugin: settings.json,
written from the settings' declarations (nvplugin/config/model.py) by charts/generate_schema.py.
"args": values passed as a serve flag; "env": values passed as an environment variable ("to":
env = the value, a list joined with commas; true = "true" when true, and its "with" value too;
address = 0.0.0.0:<port> while <x>.enabled; when = the entry's constant when true); "refused":
NVIDIA values nvplugin
accepts at some values only.
*/}}
{{- define "nvplugin.settings" -}}
{{- .Files.Get "settings.json" }}
{{- end }}

{{/*
The feature file the plugin writes the node's labels to with gfd.enabled (settings.json, from the
declaration of flags.gfd.outputFile); the chart mounts its directory from the host.
*/}}
{{- define "nvplugin.featureFile" -}}
{{- range (include "nvplugin.settings" . | fromJson).env }}
{{- if eq .setting "flags.gfd.outputFile" }}{{ .constant }}{{ end }}
{{- end }}
{{- end }}

{{- define "nvplugin.labelling" -}}
{{- if (.Values.gfd | default dict).enabled }}true{{ end }}
{{- end }}

{{/*
GFD's NodeFeature API mode (gfd.enabled with v0.17/v0.18's nfd.enableNodeFeatureApi): the plugin
publishes its node's labels as a NodeFeature object through the API (settings.json passes
GFD_USE_NODE_FEATURE_API), instead of the feature file.
*/}}
{{- define "nvplugin.nodeFeatureApi" -}}
{{- if and (include "nvplugin.labelling" .) (eq (toJson (.Values.nfd | default dict).enableNodeFeatureApi) "true") }}true{{ end }}
{{- end }}

{{/* Whether the pods talk to the API at all: per-node configs, or NodeFeature objects. */}}
{{- define "nvplugin.usesApi" -}}
{{- if or (include "nvplugin.perNode" .) (include "nvplugin.nodeFeatureApi" .) }}true{{ end }}
{{- end }}

{{/* The Role and its binding for NodeFeature objects (namespaced). */}}
{{- define "nvplugin.nodeFeatureRoleName" -}}
{{- printf "%s-nodefeature-writer" (include "nvplugin.fullname" .) | trunc 253 }}
{{- end }}

{{/*
A chart value by its path (["log", "level"]), as {"v": value}; null when it is absent. args:
Values, path.
*/}}
{{- define "nvplugin.value" -}}
{{- $v := .Values }}
{{- range .path }}
{{- $v = ternary (index (ternary $v dict (kindIs "map" $v)) .) nil (and (kindIs "map" $v) (hasKey (ternary $v dict (kindIs "map" $v)) .)) }}
{{- end }}
{{- dict "v" $v | toJson }}
{{- end }}

{{/* Whether a value is set: not null, "" or []. args: the value. */}}
{{- define "nvplugin.isSet" -}}
{{- if not (has (toJson .) (list "null" "\"\"" "[]")) }}true{{ end }}
{{- end }}

{{/*
Every value the chart cannot use, found at once and refused in one render error that lists them
all with their key paths: NVIDIA's values nvplugin's chart accepts at NVIDIA's defaults only
(settings.json "nvidia", from nvplugin/chart/values.py), NVIDIA's image, the settings'
values nvplugin accepts at some values only ("refused"), config files the plugin would refuse,
and values that contradict each other.
*/}}
{{- define "nvplugin.validate" -}}
{{- $problems := list }}
{{- $data := include "nvplugin.settings" . | fromJson }}
{{- if and .Values.metrics.enabled .Values.probes.enabled (eq (int .Values.metrics.port) (int .Values.probes.port)) }}
{{- $problems = append $problems (printf "values.metrics.port and values.probes.port are both %d: the metrics and the health probes each need their own port" (int .Values.probes.port)) }}
{{- end }}
{{- if and .Values.config.name .Values.config.map }}
{{- $problems = append $problems (printf "values.config.name (%q) and values.config.map are both set: the plugin reads config files from one ConfigMap; use config.map for one this chart manages, or config.name for yours" .Values.config.name) }}
{{- end }}
{{- $problems = concat $problems (include "nvplugin.configProblems" . | fromJsonArray) }}
{{- with include "nvplugin.defaultProblem" . }}{{ $problems = append $problems . }}{{ end }}
{{- with include "nvplugin.noDefaultProblem" (dict "Values" .Values "message" $data.noDefault) }}{{ $problems = append $problems . }}{{ end }}
{{- if include "nvplugin.gfdOnly" . }}
{{- $problems = append $problems (printf "values.devicePlugin.enabled: false: %s" $data.gfdOnly) }}
{{- end }}
{{- if regexMatch $data.image.pattern (.Values.image.repository | toString) }}
{{- $problems = append $problems (printf "values.image.repository: %q %s" .Values.image.repository $data.image.message) }}
{{- end }}
{{- if and (not .Values.image.digest) (regexMatch $data.image.tagPattern (.Values.image.tag | default "" | toString)) }}
{{- $problems = append $problems (printf "values.image.tag: %q %s" .Values.image.tag $data.image.tagMessage) }}
{{- end }}
{{- if and (eq (include "nvplugin.namespace" .) "default") (not .Values.allowDefaultNamespace) }}
{{- $problems = append $problems "values.allowDefaultNamespace: the release's namespace is \"default\"; install into another namespace (-n kube-system), or set allowDefaultNamespace=true" }}
{{- end }}
{{- range $data.nvidia }}
{{- $entry := . }}
{{- $v := (include "nvplugin.value" (dict "Values" $.Values "path" .value) | fromJson).v }}
{{- range (include "nvplugin.offDefaults" (dict "value" $v "defaults" .defaults "path" (join "." .value) "skip" .skip) | fromJsonArray) }}
{{- $leaf := (include "nvplugin.value" (dict "Values" $.Values "path" (splitList "." .)) | fromJson).v }}
{{- $problems = append $problems (printf "values.%s: %s: %s" . (toJson $leaf | trunc 80) $entry.message) }}
{{- end }}
{{- end }}
{{- range $data.refused }}
{{- $v := (include "nvplugin.value" (dict "Values" $.Values "path" .value) | fromJson).v }}
{{- if and (include "nvplugin.isSet" $v) (not (has (toJson $v) .supported)) }}
{{- $shown := ternary (printf "%q" $v) (toJson $v) (kindIs "string" $v) }}
{{- $problems = append $problems (printf "values.%s: %s" (join "." .value) (replace "{value}" $shown .message)) }}
{{- end }}
{{- end }}
{{- $mine := list }}
{{- range (include "nvplugin.env" . | fromJsonArray) }}{{ $mine = append $mine (index . 0) }}{{ end }}
{{- range (include "nvplugin.extraEnv" . | fromJsonArray) }}
{{- if has .name $mine }}
{{- $problems = append $problems (printf "values.devicePlugin.containers.main.env: %s is set by the chart from a value (settings.json); set that value instead" .name) }}
{{- end }}
{{- end }}
{{- if $problems }}
{{- fail (printf "nvplugin's chart cannot use these values (%d):\n  - %s" (len $problems) (join "\n  - " $problems)) }}
{{- end }}
{{- end }}

{{/*
The key paths below .path where .value is not one of NVIDIA's .defaults (a list): null is "not
set"; a mapping is compared key by key against the mappings among the defaults; the key paths in
.skip (settings' chart values inside NVIDIA's block: gfd.enabled) are left alone. The rule of
nvplugin/chart/values.py (off_defaults), which `nvplugin migrate` applies. Returns a JSON
list.
*/}}
{{- define "nvplugin.offDefaults" -}}
{{- $v := .value }}
{{- $out := list }}
{{- $same := kindIs "invalid" $v }}
{{- range .defaults }}{{ if eq (toJson .) (toJson $v) }}{{ $same = true }}{{ end }}{{ end }}
{{- if not $same }}
{{- $maps := list }}
{{- range .defaults }}{{ if kindIs "map" . }}{{ $maps = append $maps . }}{{ end }}{{ end }}
{{- if and (kindIs "map" $v) $maps }}
{{- range $key := keys $v | sortAlpha }}
{{- $below := list }}
{{- range $maps }}{{ if hasKey . $key }}{{ $below = append $below (get . $key) }}{{ end }}{{ end }}
{{- $sub := printf "%s.%s" $.path $key }}
{{- if has $sub ($.skip | default list) }}
{{- else if $below }}
{{- $out = concat $out (include "nvplugin.offDefaults" (dict "value" (get $v $key) "defaults" $below "path" $sub "skip" $.skip) | fromJsonArray) }}
{{- else }}
{{- $out = append $out $sub }}
{{- end }}
{{- end }}
{{- else }}
{{- $out = append $out .path }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
Chart values that reach the plugin as environment variables (which win over the config file):
[name, value], only the ones that are set, in the settings' order (settings.json "env").
NVIDIA's values use NVIDIA's variable names.
*/}}
{{- define "nvplugin.env" -}}
{{- $out := list }}
{{- range (include "nvplugin.settings" . | fromJson).env }}
{{- $v := (include "nvplugin.value" (dict "Values" $.Values "path" (index .values 0)) | fromJson).v }}
{{- if eq .to "address" }}
{{- if $v }}
{{- $port := (include "nvplugin.value" (dict "Values" $.Values "path" (index .values 1)) | fromJson).v }}
{{- $out = append $out (list .env (printf "0.0.0.0:%d" (int $port))) }}
{{- end }}
{{- else if eq .to "true" }}
{{- $with := ternary (include "nvplugin.value" (dict "Values" $.Values "path" (.with | default list)) | fromJson).v true (hasKey . "with") }}
{{- if and (eq (toJson $v) "true") (eq (toJson $with) "true") }}{{ $out = append $out (list .env "true") }}{{ end }}
{{- else if eq .to "when" }}
{{- if eq (toJson $v) "true" }}{{ $out = append $out (list .env .constant) }}{{ end }}
{{- else if include "nvplugin.isSet" $v }}
{{- $out = append $out (list .env (ternary (join "," $v) $v (kindIs "slice" $v))) }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
GPU Feature Discovery without the plugin (devicePlugin.enabled=false, gfd.enabled=true):
refused, as nvplugin's labels come from its plugin pods (nvplugin/chart/values.py: gfd_only).
*/}}
{{- define "nvplugin.gfdOnly" -}}
{{- if and (eq (toJson (.Values.devicePlugin | default dict).enabled) "false") (eq (toJson (.Values.gfd | default dict).enabled) "true") }}true{{ end }}
{{- end }}

{{/* NVIDIA's devicePlugin.enabled: false renders no plugin. */}}
{{- define "nvplugin.enabled" -}}
{{- if ne (toJson (.Values.devicePlugin | default dict).enabled) "false" }}true{{ end }}
{{- end }}

{{/* NVIDIA's devicePlugin.containers.main.env: extra variables of the plugin container. */}}
{{- define "nvplugin.extraEnv" -}}
{{- dig "containers" "main" "env" list (.Values.devicePlugin | default dict) | toJson }}
{{- end }}

{{/*
Chart values that reach the plugin as serve flags: [flag, value], only the ones that are set.
*/}}
{{- define "nvplugin.args" -}}
{{- $out := list }}
{{- range (include "nvplugin.settings" . | fromJson).args }}
{{- $v := (include "nvplugin.value" (dict "Values" $.Values "path" .value) | fromJson).v }}
{{- if include "nvplugin.isSet" $v }}{{ $out = append $out (list .flag $v) }}{{ end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
Whether the container must be privileged: DeviceSpecs (compatWithCPUManager, or passDeviceSpecs in
any config.map entry, since any may be chosen for a node) name host device nodes only a privileged
container sees, with the driver mounted from the host but no NVIDIA runtime NVML needs the
/dev/nvidia* nodes, and MPS sets the GPUs' compute mode (see nvplugin.mps).
*/}}
{{- define "nvplugin.privileged" -}}
{{- $specs := false }}
{{- range $name, $value := .Values.config.map }}
{{- $cfg := include "nvplugin.parseConfig" (dict "name" $name "value" $value) | fromJson }}
{{- if eq (toJson (dig "flags" "plugin" "passDeviceSpecs" false $cfg)) "true" }}{{ $specs = true }}{{ end }}
{{- end }}
{{- if or .Values.compatWithCPUManager $specs (and .Values.nvidiaDriverRoot (not .Values.runtimeClassName)) (include "nvplugin.mps" .) }}true{{ end }}
{{- end }}

{{/*
Whether a config file shares a resource through MPS (sharing.mps.resources): the plugin then runs
an MPS control daemon per such resource, which needs the MPS root and its shared memory from the
host, the compute capability from the NVIDIA runtime, and a privileged container (it sets the GPUs'
compute mode). Every entry of config.map counts, as a node may be given any of them; with
config.name the chart sees the ConfigMap's entries only in a cluster (lookup).
*/}}
{{- define "nvplugin.mps" -}}
{{- $entries := .Values.config.map | default dict }}
{{- if .Values.config.name }}
{{- $cm := lookup "v1" "ConfigMap" (include "nvplugin.namespace" .) .Values.config.name }}
{{- $entries = get ($cm | default dict) "data" | default dict }}
{{- end }}
{{- $mps := false }}
{{- range $name, $value := $entries }}
{{- $cfg := include "nvplugin.parseConfig" (dict "name" $name "value" $value) | fromJson }}
{{- $sharing := get $cfg "sharing" }}
{{- if kindIs "map" $sharing }}
{{- $block := get $sharing "mps" }}
{{- if and (kindIs "map" $block) (get $block "resources") }}{{ $mps = true }}{{ end }}
{{- end }}
{{- end }}
{{- if $mps }}true{{ end }}
{{- end }}

{{/*
One probe: the kubelet's httpGet on the plugin's health endpoint (container port "health").
/livez answers while the plugin's event loop turns; /readyz only while a resource is SERVING.
args: path, Values.
*/}}
{{- define "nvplugin.probe" -}}
httpGet:
  path: {{ .path | quote }}
  port: health
timeoutSeconds: {{ .Values.probes.timeoutSeconds | int }}
{{- end }}
