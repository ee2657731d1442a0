"""The training image, built by `cdk deploy` from docker/Dockerfile, in one of two places
(the `image_build` setting, infra/image_build.py):

- TrainingImage (`local`): a CDK Docker image asset, built by Docker on the deploying machine and
  pushed to the CDK assets repository. Synth never runs Docker: it copies the build context into
  cdk.out.
- TrainingImageBuild (`codebuild`): the same build context uploaded as a file asset and built by
  AWS CodeBuild in the account while the stack deploys (cdklabs-deploy-time-build's
  ContainerImageBuild), into a repository of that stack. The deploying machine needs no Docker.

Both name the image by the hash of its build context and offer `image_uri` and `grant_pull`."""
from __future__ import annotations

import json
from pathlib import Path

from aws_cdk import FileSystem, IgnoreMode, RemovalPolicy, Stack
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from cdklabs.deploy_time_build import ContainerImageBuild
from constructs import Construct

from infra.constructs.acknowledge import acknowledge

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = "docker/Dockerfile"
# Never part of the image, even inside a copied folder.
_ALWAYS_EXCLUDED = ("**/__pycache__", "**/*.pyc", "**/.pytest_cache")
# CodeBuild's general1.large ("up to 16 GiB memory and 8 vCPUs", CodeBuild API reference,
# ProjectEnvironment). The library's default, small (4 GiB, 2 vCPUs), would compile Horovod and
# nccl-tests against CUDA in 4 GiB, and the whole build has to finish within CloudFormation's
# one-hour wait for a custom resource.
BUILD_COMPUTE_TYPE = "BUILD_GENERAL1_LARGE"
# Older images stay pullable for rollbacks and running jobs; beyond that they only cost storage.
KEPT_IMAGES = 10


def dockerfile_copy_sources(dockerfile: Path) -> tuple[str, ...]:
    """The build-context paths that the Dockerfile's COPY and ADD instructions read (copies from
    other build stages, `--from=...`, read no context)."""
    sources: list[str] = []
    for line in dockerfile.read_text().replace("\\\n", " ").splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        if any(w.startswith("--from") for w in words):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if args and args[0].startswith("["):        # exec form: COPY ["src", ..., "dest"]
            args = json.loads(" ".join(args))
        sources += args[:-1]
    return tuple(dict.fromkeys(s.rstrip("/") for s in sources))


def build_context_excludes(directory: Path, file: str) -> list[str]:
    """Everything but the Dockerfile and what it copies, in .dockerignore syntax.

    The asset hash (the image tag) is the hash of the staged context, and the tag is written into
    the nodes' user data: a context of "the repository minus a list" would change the tag whenever
    infra/ or a README changed, and a replacement node would then pull an image whose code differs
    from the running nodes'. Derived from the Dockerfile, the context cannot drift from it.
    """
    keep = (file, *dockerfile_copy_sources(directory / file))
    return ["*", *(f"!{path}" for path in keep), *_ALWAYS_EXCLUDED]


class TrainingImage(Construct):
    """The image built by Docker on the deploying machine (image_build=local). One image for every
    path: the EC2 cluster nodes run it as a long-lived container and SageMaker runs it as the
    training job's algorithm image. Each training stack holds this asset; deploying either
    publishes it, and the tag is the content hash, so both stacks share one image."""

    def __init__(self, scope: Construct, id: str, *, directory: Path = REPO_ROOT,
                 file: str = DOCKERFILE) -> None:
        super().__init__(scope, id)
        self.asset = ecr_assets.DockerImageAsset(
            self, "Asset",
            directory=str(directory),
            file=file,
            exclude=build_context_excludes(directory, file),
            ignore_mode=IgnoreMode.DOCKER,
            platform=ecr_assets.Platform.LINUX_AMD64,
        )
        self.image_uri: str = self.asset.image_uri

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        return self.asset.repository.grant_pull(grantee)


def build_context_hash(directory: Path = REPO_ROOT, file: str = DOCKERFILE) -> str:
    """The hash of the build context (what the Dockerfile copies, and the Dockerfile itself), as
    CDK fingerprints an asset: the image tag of the CodeBuild path."""
    return FileSystem.fingerprint(str(directory), exclude=build_context_excludes(directory, file),
                                  ignore_mode=IgnoreMode.DOCKER)


class TrainingImageBuild(Construct):
    """The image built in the account by AWS CodeBuild while this stack deploys
    (image_build=codebuild), into this construct's ECR repository, tagged with the build
    context's hash.

    It lives in the shared stack, once: the build runs once per change of the build context, and
    both training stacks name the same image. They import only the repository's name and ARN,
    which never change; the tag is written into their templates as text. An imported value that
    changed with every image would stop the next deploy ("Export ... cannot be updated as it is in
    use"), which is why `image_uri` is not the library's (a reference to the build resource)."""

    def __init__(self, scope: Construct, id: str, *, directory: Path = REPO_ROOT,
                 file: str = DOCKERFILE) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        before = {child.node.id for child in stack.node.children}
        self.tag = build_context_hash(directory, file)
        self.repository = ecr.Repository(
            self, "Repository",
            image_scan_on_push=True,
            encryption=ecr.RepositoryEncryption.AES_256,
            # Images are rebuilt from the repository's sources; nothing is lost with the stack.
            removal_policy=RemovalPolicy.DESTROY, empty_on_delete=True,
            lifecycle_rules=[ecr.LifecycleRule(
                description=f"keep the {KEPT_IMAGES} newest images",
                max_image_count=KEPT_IMAGES)])
        self.build = ContainerImageBuild(
            self, "Build",
            directory=str(directory), file=file,
            exclude=build_context_excludes(directory, file), ignore_mode=IgnoreMode.DOCKER,
            platform=ecr_assets.Platform.LINUX_AMD64,
            repository=self.repository, tag=self.tag)
        self.image_uri: str = self.repository.repository_uri_for_tag(self.tag)
        # The library puts its CodeBuild project and its Lambda handler at the stack's top level
        # (one per stack, shared by every build in it): found as what this constructor added there.
        added = [child for child in stack.node.children if child.node.id not in before]
        (self.project,) = [c for c in added if isinstance(c, codebuild.Project)]
        (self.handler,) = [c for c in added if isinstance(c, lambda_.Function)]
        self.project.node.default_child.add_property_override(
            "Environment.ComputeType", BUILD_COMPUTE_TYPE)
        # Redundant DependsOn that cfn-lint warns of (W3005), harmless: the library makes its build
        # resource depend on the project whose name it also references, and CDK makes a Lambda
        # function depend on the role it also references.
        for resource in (self.build.node.find_child("Resource").node.default_child,
                         self.handler.node.default_child):
            resource.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
        self._acknowledge()

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        return self.repository.grant_pull(grantee)

    def _acknowledge(self) -> None:
        """cdk-nag findings on the library's own project and handler, which it does not let us
        configure; each with why it is acceptable. (The project runs privileged because Docker
        builds need the Docker daemon inside the build container.)"""
        project, handler = self.project, self.handler
        acknowledge(project, "AwsSolutions-CB4",
                    "The project produces no build artifacts (the image goes to ECR, encrypted "
                    "there); CodeBuild's key would encrypt artifacts only.")
        acknowledge(project, "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
                             "AmazonElasticContainerRegistryPublicReadOnly]",
                    "Read-only pulls from ECR Public, which the library's build logs in to; "
                    "AWS's managed read-only policy.")
        project_id = Stack.of(self).get_logical_id(project.node.default_child)
        for rule, reason in (
            ("AwsSolutions-IAM5[Resource::*]",
             "ecr:GetAuthorizationToken, which AWS does not scope to a resource; pulls and "
             "pushes are limited to this repository."),
            (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:"
             f"<AWS::AccountId>:log-group:/aws/codebuild/<{project_id}>:*]",
             "The build's log streams, named by CodeBuild per build, in the project's own log "
             "group."),
            (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:codebuild:<AWS::Region>:"
             f"<AWS::AccountId>:report-group/<{project_id}>-*]",
             "CodeBuild's default test-report groups, limited to this project's name."),
            ("AwsSolutions-IAM5[Action::s3:GetBucket*]", _ASSET_READ),
            ("AwsSolutions-IAM5[Action::s3:GetObject*]", _ASSET_READ),
            ("AwsSolutions-IAM5[Action::s3:List*]", _ASSET_READ),
            ("AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::cdk-hnb659fds-assets-"
             "<AWS::AccountId>-<AWS::Region>/*]", _ASSET_READ),
        ):
            acknowledge(project, rule, reason)
        acknowledge(handler, "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
                             "service-role/AWSLambdaBasicExecutionRole]",
                    "The handler's own logs only (AWS's managed basic execution policy); its "
                    "other permission is codebuild:StartBuild on this one project.")
        acknowledge(handler, "AwsSolutions-L1",
                    "The library fixes the handler's runtime (nodejs22.x, supported by Lambda); "
                    "it only starts the build.")


# Read access to the uploaded build context, as the library grants it.
_ASSET_READ = ("Read-only access to the CDK assets bucket of the bootstrap (the library's grant "
               "on the uploaded build context); the bucket holds only this account's deployment "
               "assets.")
